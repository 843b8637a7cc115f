"""User-facing errors.

Every mistake a user can make (a misspelt cell, a corrupt data file, a bad
recipe key) raises a :class:`UserError`.  The CLI catches it, prints its
message as one paragraph and exits with code 2 — never a raw traceback.
Library code raises the most specific subclass so callers can tell them apart.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class UserError(Exception):
    """A problem with the user's input. ``str(err)`` is the full message."""

    exit_code = 2


class ConfigError(UserError):
    """A recipe or ``--set`` override that does not fit the config schema."""


def check_choice(option: str, value: object, choices: tuple[str, ...]) -> None:
    """ConfigError naming ``option``, its value and the allowed ``choices``."""
    if value not in choices:
        raise ConfigError(f"{option} must be one of {', '.join(choices)}, got {value!r}")


class UnknownNameError(ConfigError, KeyError):
    """An unknown registry name or config key, with the valid choices."""

    def __init__(self, kind: str, name: str, choices: Iterable[str], hint: str = ""):
        self.kind, self.name = kind, name
        self.choices = sorted(choices)
        super().__init__(self._message(hint))

    def _message(self, hint: str) -> str:
        msg = f"unknown {self.kind} {self.name!r}."
        close = did_you_mean(self.name, self.choices)
        if close:
            msg += f" Did you mean {close!r}?"
        msg += f" Valid choices: {', '.join(self.choices) or '(none)'}."
        if hint:
            msg += " " + hint
        return msg

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class DataError(UserError):
    """A data file that is missing, corrupt, mis-encoded or malformed."""


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated, or belongs to another run."""


class RunDirError(UserError):
    """An output directory that already holds a different run."""


def did_you_mean(name: str, choices: Iterable[str]) -> str | None:
    """The closest valid choice to ``name``, or None if nothing is close."""
    choices = list(choices)
    # Treat '-' and '_' alike, as users type both.
    norm = {c.replace("_", "-").lower(): c for c in choices}
    key = name.replace("_", "-").lower()
    if key in norm:
        return norm[key]
    close = difflib.get_close_matches(key, list(norm), n=1, cutoff=0.6)
    return norm[close[0]] if close else None


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: ``file`` or ``file, line N``."""
    return f"{path}, line {line}" if line is not None else f"{path}"


def one_paragraph(text: object) -> str:
    """A message on one line (line breaks and runs of spaces as one space): what a command
    prints for a refusal, never a block a reader has to piece together."""
    return " ".join(str(text).split())


def exit_status(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status, with the command line's contract for the tools that are not
    ``lstmablate`` commands (``python -m lstmablate.bench.gpu_check``, the GPU-window tool,
    ``tools/pages.py``): a :class:`UserError` or an ``OSError`` (the file system refused) is
    one paragraph on stderr, ``PROG: error: ...``, and exit 2; Ctrl-C is one line and 130.
    Exit 1 is left to what ``body`` returns for its own outcome (a check that ran and did
    not pass), never a refusal."""
    import sys

    try:
        return body()
    except UserError as e:
        print(f"{prog}: error: {one_paragraph(e)}", file=sys.stderr, flush=True)
        return e.exit_code
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"{prog}: error: the operating system refused a file operation{where}: "
              f"{one_paragraph(e.strerror or e)}. Fix the cause and run the same command again.",
              file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted.", file=sys.stderr, flush=True)
        return 130
