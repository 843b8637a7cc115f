"""The README's "Using it" block is what `make readme-check` runs: literal commands of
commands that exist, nothing left to fill in (RUN, FILE, [--option])."""

from __future__ import annotations

import shlex

from readme_check import ROOT, _strip_comment, readme_commands, stray_files


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


def test_the_readme_is_read_in_ten_minutes_and_defines_the_headline_terms():
    """At most 200 lines; every name the headline table uses is explained under it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    after_table = text[text.index("<!-- /generated -->"):]
    for term in ("WCPA", "−S-RNN", "−S-RNN−OUT", "−S-RNN−HIDDEN", "−GATES", "Stand-in",
                 "Paper scale", "Parser-v1", "ASO", "perplexity", "LAS", "BLEU", "F1"):
        assert term in after_table, term
    assert "## What is guaranteed" not in text  # (docs/guarantees.md)


def test_the_readme_commands_write_under_runs_only(tmp_path):
    (tmp_path / "runs").mkdir()
    assert stray_files(tmp_path) == []
    (tmp_path / "curves.png").write_text("")
    (tmp_path / "dyck-files").mkdir()
    assert stray_files(tmp_path) == ["curves.png", "dyck-files"]
    for cmd in readme_commands():
        for word in shlex.split(cmd):
            if word.endswith((".png", ".tex", ".jsonl", "-files/")):
                assert word.startswith("runs/"), cmd
