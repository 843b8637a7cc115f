"""What a GPU window carries to the GPU machine, and installs there (:mod:`.window`).

``prepare`` (here, with a network): :func:`download_wheels` fetches the wheels the GPU machine
lacks, for its Python and platform, and :func:`copy_data` copies the files the plan's recipes
read -- into the two folders (git-ignored) that travel with the checkout
(:func:`.window_files.carried_wheels`, :func:`.window_files.carried_data`); then
:func:`check_travel` says whether all that travels (the checkout and the two folders) is
within what the GPU machine's tool carries, before any GPU time is spent finding out.

``run`` (on the GPU machine, before anything of the project is imported): :func:`install`
installs from the carried wheels what is missing, into the window's site folder (not carried:
the second command finds it, :func:`install_env`), and the checkout itself where it is not
installed.  Only the standard library and the package's bottom floor are imported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import site as python_site
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path
from typing import Any

from lstmablate import io

from .gpu_args import ROOT
from .window_files import WindowError, carried_wheels, say, site_dir

#: the GPU machine's Python and platform, for ``pip download`` (what the wheels are built for)
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")
#: what ``prepare`` downloads by default: the project's dependencies that the GPU machine's
#: image lacks (the tasks of the window's runs need sacremoses; conllu is the parser's)
DEFAULT_WHEELS = ("sacremoses", "conllu")
#: the most the GPU machine's tool carries to it in one call: the checkout's tracked files,
#: its untracked files that git does not ignore, and the carried folders, together (a call
#: over it is refused)
TRAVEL_LIMIT_BYTES = 64 * 2**20


# ---------------------------------------------------------------------------------
# prepare (on a machine with a network)
# ---------------------------------------------------------------------------------

def download_wheels(names: list[str], dest: Path, python: str = DEVICE_PYTHON,
                    platforms: tuple[str, ...] = DEVICE_PLATFORMS) -> list[Path]:
    """``pip download`` of ``names`` and what they need, as wheels for the GPU machine's
    Python and platform, into ``dest``; a distribution installed here is taken at the version
    installed here (the one this checkout is tested with: e.g. the NMT task's tokeniser)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each (two would stop the install)
        old.unlink()
    if not names:
        return []
    names = [f"{n}=={metadata.version(n)}" if _installed(n) else n for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *[a for p in platforms for a in ("--platform", p)],
           "-d", str(dest), *names]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise WindowError(f"`pip download` of {' '.join(names)} failed:\n{r.stderr[-2000:]}\n"
                          "Check the names and the network, or give --platform for another "
                          "manylinux tag.")
    return sorted(dest.glob("*.whl"))


def copy_data(plan: list[list[dict]], data_dir: str | None, dest: Path) -> list[Path]:
    """The files the plan's recipes read (each task's ``required_files``), copied from the
    data directory into ``dest`` under the same relative paths (compressed as they are)."""
    from lstmablate.data import find_file, resolve_data_dir
    from lstmablate.recipes import load_recipe, resolve_config
    from lstmablate.run.runner import make_task
    from lstmablate.task import get_task

    source = resolve_data_dir(data_dir)
    copied = []
    for recipe in dict.fromkeys(g["recipe"] for slot in plan for g in slot):
        spec = load_recipe(recipe)[1]
        cfg = resolve_config(get_task(str(spec["task"])), list(spec["cells"])[0], recipe=recipe)
        for rel in make_task(cfg, source, None).required_files():
            src = find_file(source, rel)  # a DataError names the file and how to get it
            target = dest / src.relative_to(source)
            io.atomic_write(target, lambda f, src=src: _copy_regular(src, f))
            copied.append(target)
    return copied


def travelling_files(root: Path, carried: list[Path]) -> dict[str, int] | None:
    """What travels to the GPU machine, path (relative to ``root``) -> bytes: the files git
    lists in the checkout ``root`` (tracked, and untracked where not ignored: ``git ls-files
    --cached --others --exclude-standard``; a tracked file deleted from the working tree does
    not travel) and every file under the ``carried`` folders; None where ``root`` is not a git
    checkout (or git is not there), so nothing can be said."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    names = [n for n in r.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    names += [p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p)
              for folder in carried if folder.is_dir() for p in folder.rglob("*")]
    sizes = {}
    for name in names:
        path = root / name
        if path.is_file() and not path.is_symlink():
            sizes[name] = path.stat().st_size
    return sizes


def check_travel(root: Path, carried: list[Path], limit: int = TRAVEL_LIMIT_BYTES) -> str:
    """One line on what travels to the GPU machine (:func:`travelling_files`) against
    ``limit``; a WindowError naming the largest folders where it is over it (the tool would
    refuse the call: nothing would run, and the start-up would still count)."""
    sizes = travelling_files(root, carried)
    if sizes is None:
        return f"{root} is not a git checkout here: what travels to the GPU machine is unknown"
    total = sum(sizes.values())
    if total <= limit:
        return (f"{total / 2**20:.1f} MiB travel to the GPU machine in all (the checkout and the "
                f"carried folders; its tool carries at most {limit / 2**20:.0f} MiB)")
    folders: dict[str, int] = {}
    for name, size in sizes.items():
        top = "/".join(name.split("/")[:2]) if "/" in name else name
        folders[top] = folders.get(top, 0) + size
    largest = sorted(folders.items(), key=lambda kv: -kv[1])[:3]
    shown = ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in largest)
    raise WindowError(
        f"{total / 2**20:.1f} MiB would travel to the GPU machine (the checkout's files git "
        f"lists and the carried folders), more than the {limit / 2**20:.0f} MiB its tool carries: "
        f"the call would be refused. The largest: {shown}. Leave out of the checkout what the "
        "window does not need (a file git ignores does not travel), or carry less; the wheels "
        "and data just prepared are kept.")


def _copy_regular(src: Path, out: Any) -> None:
    """The bytes of the regular file ``src`` into ``out`` (a FIFO or a device is refused)."""
    fd = io.open_regular(src, WindowError)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)


# ---------------------------------------------------------------------------------
# install (on the GPU machine, before anything of the project is imported)
# ---------------------------------------------------------------------------------

def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def wheel_distribution(path: Path) -> str:
    """The distribution a wheel file holds (its name's first part, normalised)."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def project_dependencies() -> list[str]:
    """The distributions pyproject.toml's ``dependencies`` name (without versions)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: nothing to report
        return []
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps]


def install(base: Path, env: dict[str, str]) -> dict[str, Any]:
    """Install what is missing: every carried wheel whose distribution is not installed
    (``pip install --no-index --no-deps --target .gpuwindow/local/site``), then the checkout
    (``pip install --no-deps --no-build-isolation -e .``) where it is not installed.  ``env``
    (and this process's ``sys.path``) gets the site folder.  Returns
    what was installed and what is still missing."""
    site = site_dir(base)
    site.mkdir(parents=True, exist_ok=True)
    install_env(base, env)
    wheels = sorted(carried_wheels(base).glob("*.whl"))
    todo = [w for w in wheels if not _installed(wheel_distribution(w))]
    report: dict[str, Any] = dict(site=str(site), installed=[w.name for w in todo])
    if todo:
        _pip(["install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site),
              *map(str, todo)], env, "the carried wheels")
        importlib.invalidate_caches()
    # (``lstmablate_tasks`` exists only installed: the checkout names its folder tasks/)
    if importlib.util.find_spec("lstmablate_tasks") is None:
        try:
            _pip(["install", "-q", "--no-deps", "--no-build-isolation", "-e", str(ROOT)], env,
                 "the checkout")
            report["project"] = "installed (pip install --no-deps -e .)"
        except WindowError as err:  # e.g. a setuptools too old for an editable install
            say(f"{err}\ninstalling it as a package instead")
            _pip(["install", "-q", "--no-deps", "--no-build-isolation", str(ROOT)], env,
                 "the checkout")
            report["project"] = "installed (pip install --no-deps .)"
        # this process sees it too (an editable install hooks in through a .pth file, which
        # Python reads at start-up): the plan reads the recipes from the installed package
        python_site.addsitedir(sysconfig.get_paths()["purelib"])
        importlib.invalidate_caches()
        if importlib.util.find_spec("lstmablate_tasks") is None:
            raise WindowError("the checkout was installed, but this Python does not see it yet: "
                              "run the same command again")
    importlib.invalidate_caches()  # (what the installs added, for the checks below)
    report["missing"] = [d for d in project_dependencies() if not _installed(d)]
    return report


def _pip(args: list[str], env: dict[str, str], what: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise WindowError(f"installing {what} failed (pip {' '.join(args[:2])}):\n"
                          f"{r.stderr[-2000:]}")


def install_env(base: Path, env: Any) -> None:
    """The site folder of an earlier install on ``sys.path`` and in ``env``'s PYTHONPATH."""
    site = site_dir(base)
    if site.is_dir():
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
