"""Compiling the native kernels: one shared library per kernel family, built on first use.

The C sources are package data: beside this module the ones every library shares,
``la_blas.c`` (the BLAS pointers), ``la_gemm.c`` (our packed GEMM for the per-step products)
and their headers, and beside each family's module its library's own source, as the family
declares it (``KernelFamily.native``: ``lstm/lstm_family.c``, ``gru/gru.c``,
``second_order/second_order.c``; ``interface.native_source``), which is compiled twice, float32
(``-DLA_DOUBLE=0``) and float64 (``-DLA_DOUBLE=1``), and linked with the other two into
``<family>-<key>.so``.  Plain C99 (with GCC/Clang vector extensions in ``la_gemm.c``) and
the system compiler, no PyTorch headers: a family builds in a few seconds, once per
machine, and is cached.
(``torch.utils.cpp_extension`` would need a C++ compiler and PyTorch's headers and take
about a minute per build, for no gain: the kernels touch no PyTorch object.)

* **Compiler**: ``CC`` (split like a shell would: ``CC="ccache gcc"`` works), else ``cc``,
  ``gcc`` or ``clang`` on the PATH; ``CFLAGS`` (shell-split too) are added after ours.
  Flag sets are tried from the fastest (``-O3 -march=native``, AVX-512-wide vectors on
  x86, OpenMP) down to plain ``-O3``; the first that builds is kept.
* **Cache key**: the sources, the compiler (its command and ``--version``), ``CFLAGS``,
  this CPU's instruction set (:func:`cpu_key`: the x86 ``flags``, or the ARM
  ``Features`` with the implementer, part and revision, and the machine type), PyTorch's
  version and the platform: a ``-march=native`` library is never loaded on another CPU.
* **Cache directory** (:func:`cache_dir`): ``LSTMABLATE_KERNEL_CACHE``, else
  ``$XDG_CACHE_HOME/lstmablate/kernels`` (``~/.cache/...``), else (e.g. a read-only home)
  ``<tmp>/lstmablate-kernels-<uid>``.  A directory is used only if it is owned by this
  user and no one else may write to it (created 0700); otherwise the next one is tried,
  and last a fresh ``mkdtemp`` directory.  A library is loaded only if it is a regular
  file owned by this user and writable by no one else (:func:`check_private_file`).
* **Failures are remembered**: a build that fails writes ``<family>-<key>.failed`` (the
  compiler's error); later processes read it instead of compiling again.  A new key (an
  installed compiler, other CFLAGS, new sources) builds afresh; to retry the same key set
  ``LSTMABLATE_NATIVE_RETRY=1`` or call :func:`forget_failures`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from lstmablate.errors import UserError
from lstmablate.io import atomic_write_json

from .. import switches
from ..interface import native_source

#: the folder of the C sources every library shares (``la_*``): this module's
CSRC = Path(__file__).resolve().parent
#: the sources every family library is built from, besides its own
COMMON_SOURCES = ("la_blas.h", "la_blas.c", "la_gemm.c", "la_real.h")
#: flags for one source only: our GEMM needs a * b + c fused (FMA)
SOURCE_FLAGS = {"la_gemm.c": ["-ffp-contract=fast"]}


class BuildError(RuntimeError):
    """A native kernel library cannot be built (or used) here; the message says why."""


# ---------------------------------------------------------------------------------
# the compiler
# ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    compiler: tuple[str, ...]  # the command, e.g. ("ccache", "/usr/bin/gcc")
    cflags: tuple[str, ...]  # the user's CFLAGS
    version: str  # the first line of `<compiler> --version`

    def describe(self) -> str:
        return " ".join(self.compiler) + (f" (CFLAGS {' '.join(self.cflags)})" if self.cflags else "")


def _split(var: str, value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as err:  # an unbalanced quote
        raise BuildError(f"{var}={value!r} cannot be split like a shell command line: {err}") from None


@lru_cache(maxsize=8)
def _toolchain(cc_env: str, cflags_env: str, path_env: str) -> Toolchain:
    del path_env  # part of the cache key only: a new PATH may find another compiler
    argv = _split("CC", cc_env)
    if not argv:
        found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not found:
            raise BuildError("no C compiler found (cc, gcc or clang on the PATH); set CC")
        argv = [found]
    exe = shutil.which(argv[0])
    if exe is None:
        raise BuildError(f"the C compiler {argv[0]!r} (from CC={cc_env!r}) was not found")
    argv[0] = exe
    try:
        proc = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        raise BuildError(f"the C compiler {' '.join(argv)} does not run: {err}") from None
    if proc.returncode != 0:
        raise BuildError(f"`{' '.join(argv)} --version` failed: {proc.stderr.strip()[-300:]}")
    version = (proc.stdout.strip().splitlines() or ["?"])[0]
    return Toolchain(tuple(argv), tuple(_split("CFLAGS", cflags_env)), version)


def toolchain() -> Toolchain:
    """The C compiler and flags from the environment (see the module docstring)."""
    return _toolchain(switches.read("CC"), switches.read("CFLAGS"), switches.read("PATH"))


def flag_sets(machine: str | None = None) -> list[list[str]]:
    """Optimisation flags, tried in order (the first set that builds is used)."""
    machine = (machine or platform.machine()).lower()
    sets = [["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3", "-fopenmp-simd"],
            ["-O3"]]
    if machine in ("x86_64", "amd64"):  # 16 floats a vector where AVX-512 exists
        sets.insert(0, ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"])
    elif machine in ("aarch64", "arm64"):  # older GCCs know only -mcpu=native on ARM
        sets.insert(1, ["-O3", "-mcpu=native", "-fopenmp"])
    return sets


BASE_FLAGS = ["-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=c99"]


# ---------------------------------------------------------------------------------
# the cache key: what a built library depends on
# ---------------------------------------------------------------------------------

def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return fh.read()
    except OSError:
        return ""


def cpu_key(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """A text that differs between CPUs with different instruction sets: the machine type
    plus, on x86, the first ``flags`` line of /proc/cpuinfo; on ARM the ``Features`` line
    with ``CPU implementer``, ``CPU architecture``, ``CPU variant``, ``CPU part`` and
    ``CPU revision`` (every core type present); elsewhere what the platform reports."""
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    machine = machine or platform.machine()
    lines = [ln.strip() for ln in info.splitlines()]
    flags = next((ln for ln in lines if ln.startswith("flags")), None)
    if flags:  # x86
        return f"{machine}|{flags}"
    arm_keys = ("Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part",
                "CPU revision")
    arm = sorted({ln for ln in lines if ln.split(":")[0].strip() in arm_keys})
    if arm:
        return f"{machine}|" + "|".join(arm)
    extra = platform.processor()
    if sys.platform == "darwin":
        try:
            extra = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "hw.optional"],
                                   capture_output=True, text=True, timeout=10).stdout.strip() or extra
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{machine}|{extra}"


@lru_cache(maxsize=None)
def source_text(family: str) -> str:
    """Every source a family's library is built from, concatenated (for the key), each
    headed by its file name (not its folder: moving a file changes no key)."""
    files = [*(CSRC / n for n in COMMON_SOURCES), native_source(family)]
    try:
        return "\n".join(f"// {f.name}\n" + f.read_text() for f in files)
    except OSError as err:
        raise BuildError(f"the C sources of the native kernels are missing ({err}); the "
                         f"package data under {CSRC.parent} was not installed") from None


@lru_cache(maxsize=None)
def source_version(family: str) -> int:
    """A number from the sources' hash, compiled into the library (``la_version``), so a
    stale library is recognised when loaded."""
    return int(hashlib.sha256(source_text(family).encode()).hexdigest()[:12], 16)


def library_key(family: str, tc: Toolchain | None) -> str:
    import torch

    parts = [source_text(family), cpu_key(), torch.__version__, sys.platform,
             "|".join(tc.compiler) if tc else (f"no compiler: CC={switches.read('CC')} "
                                               f"PATH={switches.read('PATH')}"),
             "|".join(tc.cflags) if tc else "", tc.version if tc else ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------
# the private cache directory
# ---------------------------------------------------------------------------------

def _private(path: Path, create_mode: int = 0o700) -> Path | None:
    """``path`` as a directory only this user may write to (created 0700), or None."""
    try:
        path.mkdir(mode=create_mode, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    if hasattr(os, "getuid"):
        if st.st_uid != os.getuid():
            return None
        if st.st_mode & 0o022:  # others may write: tighten it if we can, else refuse
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
            except OSError:
                return None
            if path.stat().st_mode & 0o022:
                return None
    if not os.access(path, os.W_OK | os.X_OK):
        return None
    return path


_fallback_dir: Path | None = None


def cache_dir() -> Path:
    """The directory the libraries are cached in (see the module docstring)."""
    global _fallback_dir
    explicit = switches.read("LSTMABLATE_KERNEL_CACHE")
    if explicit:
        candidates = [Path(explicit).expanduser()]
    else:
        base = switches.read("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        candidates = [Path(base) / "lstmablate" / "kernels",
                      Path(tempfile.gettempdir()) / f"lstmablate-kernels-{uid}"]
    for c in candidates:
        d = _private(c)
        if d is not None:
            return d
    if _fallback_dir is None or not _fallback_dir.is_dir():  # unpredictable, 0700, this process
        _fallback_dir = Path(tempfile.mkdtemp(prefix="lstmablate-kernels-"))
    return _fallback_dir


def check_private_file(path: Path) -> None:
    """Refuse (BuildError) to load ``path`` unless it is a regular file owned by this user
    that no one else may write to."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise BuildError(f"cannot read {path}: {err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BuildError(f"{path} is not a regular file; not loading it")
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise BuildError(f"{path} is owned by another user or writable by others; not loading "
                         "it (remove it, or set LSTMABLATE_KERNEL_CACHE to a private directory)")


# ---------------------------------------------------------------------------------
# building (or finding) a family's library
# ---------------------------------------------------------------------------------

def _failure_file(directory: Path, family: str, key: str) -> Path:
    return directory / f"{family}-{key}.failed"


def forget_failures() -> int:
    """Delete every remembered build failure in the cache directory (so the next use
    tries again); returns how many there were."""
    n = 0
    for f in cache_dir().glob("*.failed"):
        try:
            f.unlink()
            n += 1
        except OSError:
            pass
    return n


def _remember_failure(path: Path, family: str, tc: Toolchain | None, message: str) -> None:
    doc = dict(family=family, compiler=tc.describe() if tc else None, error=message,
               when=time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        atomic_write_json(path, doc)
    except UserError:
        pass  # not remembering the failure only costs another attempt


def _compile(family: str, tc: Toolchain, flags: list[str], workdir: Path, out: Path) -> str | None:
    """One attempt with one flag set; returns the compiler's error, or None on success."""
    version = str(source_version(family))
    common = [*tc.compiler, *flags, *BASE_FLAGS, f"-I{CSRC}", f"-DLA_SOURCE_VERSION={version}L",
              *tc.cflags]
    steps = [[*common, *SOURCE_FLAGS.get(src, []), "-c", str(CSRC / src),
              "-o", str(workdir / (src[:-2] + ".o"))] for src in ("la_blas.c", "la_gemm.c")]
    for double in (0, 1):
        steps.append([*common, f"-DLA_DOUBLE={double}", "-c", str(native_source(family)),
                      "-o", str(workdir / f"{family}_{double}.o")])
    steps.append([*tc.compiler, *flags, "-shared", *tc.cflags, str(workdir / "la_blas.o"),
                  str(workdir / "la_gemm.o"), str(workdir / f"{family}_0.o"),
                  str(workdir / f"{family}_1.o"), "-o", str(out), "-lm"])
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as err:
            return f"{' '.join(cmd)}: {err}"
        if proc.returncode != 0:
            return (proc.stderr or proc.stdout).strip()[-800:]
    return None


def build_library(family: str) -> Path:
    """The path of ``family``'s library, compiling it if it is not cached; raises
    :class:`BuildError` (a remembered failure included) when it cannot be built here."""
    native_source(family)  # an unknown library: ValueError
    directory = cache_dir()
    try:
        tc = toolchain()
        tc_error = None
    except BuildError as err:
        tc, tc_error = None, str(err)
    key = library_key(family, tc)
    so = directory / f"{family}-{key}.so"
    failed = _failure_file(directory, family, key)
    if so.exists():
        return so
    if failed.exists() and not switches.native_retry():
        try:
            doc = json.loads(failed.read_text())
            msg = f"{doc.get('error', '?')} (at {doc.get('when', '?')})"
        except (OSError, ValueError):
            msg = "see the file"
        raise BuildError(f"building the {family} kernels failed before, so it is not tried again "
                         f"({failed}): {msg}. To retry: set LSTMABLATE_NATIVE_RETRY=1, delete that "
                         "file, or call "
                         "lstmablate.cells.kernels.common.native_build.forget_failures()")
    if tc is None:
        _remember_failure(failed, family, None, tc_error)
        raise BuildError(tc_error)
    errors = []
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        work = Path(tmp)
        out = work / f"{family}.so"
        for flags in flag_sets():
            err = _compile(family, tc, flags, work, out)
            if err is None:
                os.chmod(out, 0o700)
                os.replace(out, so)  # atomic: concurrent builders do not collide
                failed.unlink(missing_ok=True)
                return so
            errors.append(f"[{' '.join(flags)}] {err}")
    message = f"{tc.describe()} ({tc.version}) failed: {errors[-1]}"
    _remember_failure(failed, family, tc, message)
    raise BuildError(message)
