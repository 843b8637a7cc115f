"""The README's "Using it" block is what `make readme-check` runs: literal commands of
commands that exist, nothing left to fill in (RUN, FILE, [--option])."""

from __future__ import annotations

import shlex

from readme_check import _strip_comment, readme_commands


def test_the_using_it_block_is_literal_commands_that_exist():
    from test_cli_help_and_listings import COMMANDS

    known = {" ".join(p) for p, _ in COMMANDS}
    commands = readme_commands()
    assert len(commands) >= 15
    for cmd in commands:
        words = shlex.split(cmd)
        assert words[0] == "lstmablate", cmd
        assert not any(w in ("RUN", "FILE", "TASK", "RUN_DIR") or w.startswith("[") for w in words), cmd
        if words[1].startswith("--"):
            continue
        name = " ".join(words[1:3]) if words[1] == "data" else words[1]
        assert name in known, cmd
    # the order a new user meets: the own run is trained before it is evaluated or drawn
    first = {c.split()[1]: i for i, c in reversed(list(enumerate(commands)))}
    assert first["train"] < first["eval"] and first["train"] < first["visualize"]


def test_comments_are_stripped_but_not_inside_quotes():
    assert _strip_comment('lstmablate x --text "a # b"  # note') == 'lstmablate x --text "a # b"  '
    assert _strip_comment("lstmablate list cells") == "lstmablate list cells"
    assert _strip_comment("# only a comment") == ""
