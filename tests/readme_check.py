"""Run the README's "Using it" commands in order, as a new user would after `make demo`.

    python tests/readme_check.py            # what `make readme-check` (and CI) runs

In a fresh temporary folder: first the demo (`make demo` with its runs folder there), then
every command of the first ```bash block under "## Using it", each in a shell, in order.
Any command that fails (non-zero exit) fails the check, with its output.  Comments (`# ...`)
and blank lines are skipped; nothing else is rewritten, so the README says exactly what runs.
The commands may write only under `runs/` (git-ignored): a file they leave beside it would be
an untracked file in the root of a user's checkout, and fails the check too.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Using it"


def readme_commands(readme: Path = ROOT / "README.md") -> list[str]:
    """The commands of the first ```bash block of the README's "Using it" section."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(SECTION)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    if block is None:
        raise SystemExit(f"{readme}: no ```bash block under {SECTION!r}")
    commands = []
    for line in block.group(1).splitlines():
        line = _strip_comment(line).strip()
        if line:
            commands.append(line)
    return commands


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes is kept)."""
    at = _comment_start(line)
    return line if at is None else line[:at]


def _comment_start(line: str) -> int | None:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return None


def run(cmd: str, cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    print(f"$ {cmd}", flush=True)
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=1800)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"README command failed (exit {r.returncode}): {cmd}")
    print(f"  ok ({took:.1f} s)", flush=True)
    return took


def main() -> None:
    commands = readme_commands()
    bindir = str(Path(sys.executable).parent)  # the environment's `lstmablate` script
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    with tempfile.TemporaryDirectory(prefix="readme-check-") as tmp:
        cwd = Path(tmp)
        make = os.environ.get("MAKE", "make")
        run(f"{make} -s -C {shlex.quote(str(ROOT))} demo RUNS={shlex.quote(str(cwd / 'runs'))} "
            f"PY={shlex.quote(sys.executable)}", cwd, env)
        total = sum(run(cmd, cwd, env) for cmd in commands)
        left = stray_files(cwd)
        if left:
            raise SystemExit(f"the README's commands left {', '.join(left)} beside runs/: in a "
                             "checkout these are untracked files; write them under runs/.")
    print(f"{len(commands)} README commands ran in order ({total:.0f} s after the demo).")


#: what the README's commands may leave in the folder they run in (git-ignored in a checkout)
KEPT = ("runs",)


def stray_files(folder: Path) -> list[str]:
    """The entries of ``folder`` other than :data:`KEPT`, sorted."""
    return sorted(p.name for p in folder.iterdir() if p.name not in KEPT)


if __name__ == "__main__":
    main()
