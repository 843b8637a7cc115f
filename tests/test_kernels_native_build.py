"""Building the native kernels (``lstmablate.cells.kernels.native_build``): the compiler
from CC/CFLAGS split like a shell would, the CPU key (x86 and ARM), the private cache
directory, refusing files others could have planted, and remembered build failures.

The builds here go to a temporary cache directory (``LSTMABLATE_KERNEL_CACHE``), so they
never touch the user's cache; a real compile takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys

import pytest

from lstmablate.cells.kernels.common import native, native_build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv("LSTMABLATE_KERNEL_CACHE", str(d))
    monkeypatch.delenv("LSTMABLATE_NATIVE_RETRY", raising=False)
    return d


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler here")
    return cc


def _fake_cc(tmp_path, fails: bool):
    """A compiler that answers --version, records every other call in calls.log, and fails
    (``error: boom``) or delegates to the real one."""
    log = tmp_path / "calls.log"
    real = shutil.which("cc") or shutil.which("gcc") or "false"
    script = tmp_path / "fakecc"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "fakecc 1.0"; exit 0; fi\n'
        f'echo call >> "{log}"\n'
        + ('echo "error: boom" >&2; exit 1\n' if fails else f'exec "{real}" "$@"\n'))
    script.chmod(0o755)
    return script, log


# ---------------------------------------------------------------------------------
# the compiler
# ---------------------------------------------------------------------------------

def test_cc_and_cflags_are_split_like_a_shell(cache, monkeypatch):
    """``CC="env cc"`` (a wrapper and a compiler, as ``CC="ccache gcc"``) and a CFLAGS with
    two flags: the build runs the wrapper with the compiler as its argument, and the
    library loads and passes its self-test."""
    cc = _compiler()
    monkeypatch.setenv("CC", f"env '{cc}'")
    monkeypatch.setenv("CFLAGS", "-DLA_TEST_FLAG=1  -g0")
    tc = native_build.toolchain()
    assert tc.compiler == (shutil.which("env"), cc) and tc.cflags == ("-DLA_TEST_FLAG=1", "-g0")
    path = native_build.build_library("gru")
    assert path.parent == cache and path.name.startswith("gru-")
    lib = native.NativeLibrary("gru", path, native.blas_pointers())
    lib.self_test()
    # other CFLAGS are another library
    monkeypatch.setenv("CFLAGS", "-g0")
    assert native_build.library_key("gru", native_build.toolchain()) != path.stem.split("-", 1)[1]


def test_bad_cc_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc -O2")
    with pytest.raises(native_build.BuildError, match="'/nonexistent/cc'.*was not found"):
        native_build.toolchain()
    monkeypatch.setenv("CC", "gcc 'unbalanced")
    with pytest.raises(native_build.BuildError, match="cannot be split like a shell"):
        native_build.toolchain()


# ---------------------------------------------------------------------------------
# the CPU key
# ---------------------------------------------------------------------------------

ARM_A = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
# an older core: fewer features (no fphp/asimddp), another part
ARM_B = ARM_A.replace(" fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp", " cpuid").replace(
    "0xd0c", "0xd08")


def test_cpu_key_tells_arm_cores_and_x86_flags_apart():
    a, b = native_build.cpu_key(ARM_A, "aarch64"), native_build.cpu_key(ARM_B, "aarch64")
    assert a != b and "asimddp" in a and "0xd0c" in a
    assert native_build.cpu_key(ARM_A, "aarch64") == a  # deterministic
    assert native_build.cpu_key(ARM_A.replace("0xd0c", "0xd40"), "aarch64") != a  # same features, other core
    x1 = native_build.cpu_key("model name\t: X\nflags\t\t: fpu sse avx2\n", "x86_64")
    x2 = native_build.cpu_key("model name\t: X\nflags\t\t: fpu sse avx2 avx512f\n", "x86_64")
    assert x1 != x2 and x1.startswith("x86_64|") and "avx2" in x1
    assert native_build.cpu_key("", "arm64").startswith("arm64|")  # no cpuinfo: the platform
    here = native_build.cpu_key()
    assert here and here == native_build.cpu_key()


# ---------------------------------------------------------------------------------
# the private cache directory
# ---------------------------------------------------------------------------------

needs_posix = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")


@needs_posix
def test_cache_dir_is_created_private(cache):
    d = native_build.cache_dir()
    assert d == cache and stat.S_IMODE(d.stat().st_mode) == 0o700


@needs_posix
def test_cache_dir_open_to_others_is_tightened(cache):
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    assert native_build.cache_dir() == cache
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


@needs_posix
@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="making a directory another user's needs root")
def test_cache_dir_of_another_user_is_not_used(cache):
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    d = native_build.cache_dir()
    assert d != cache and stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.getuid()


@needs_posix
def test_files_others_could_have_written_are_not_loaded(tmp_path):
    f = tmp_path / "lib.so"
    f.write_bytes(b"\x7fELF")
    os.chmod(f, 0o700)
    native_build.check_private_file(f)  # fine
    os.chmod(f, 0o722)
    with pytest.raises(native_build.BuildError, match="writable by others"):
        native_build.check_private_file(f)
    os.chmod(f, 0o700)
    link = tmp_path / "link.so"
    link.symlink_to(f)
    with pytest.raises(native_build.BuildError, match="not a regular file"):
        native_build.check_private_file(link)
    if os.getuid() == 0:
        os.chown(f, 12345, 12345)
        with pytest.raises(native_build.BuildError, match="owned by another user"):
            native_build.check_private_file(f)


# ---------------------------------------------------------------------------------
# remembered failures
# ---------------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "win32", reason="a shell script compiler")
def test_a_failed_build_is_remembered_until_a_retry_is_asked_for(cache, tmp_path, monkeypatch):
    fake, log = _fake_cc(tmp_path, fails=True)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(native_build.BuildError, match="boom"):
        native_build.build_library("gru")
    tried = len(log.read_text().splitlines())
    assert tried == len(native_build.flag_sets())  # every flag set once
    markers = list(cache.glob("gru-*.failed"))
    assert len(markers) == 1
    # a new process (here: the same call again) reads the failure instead of compiling
    with pytest.raises(native_build.BuildError, match="failed before.*boom.*LSTMABLATE_NATIVE_RETRY"):
        native_build.build_library("gru")
    assert len(log.read_text().splitlines()) == tried
    # asking for a retry compiles again
    monkeypatch.setenv("LSTMABLATE_NATIVE_RETRY", "1")
    with pytest.raises(native_build.BuildError, match="boom"):
        native_build.build_library("gru")
    assert len(log.read_text().splitlines()) == 2 * tried
    monkeypatch.delenv("LSTMABLATE_NATIVE_RETRY")
    assert native_build.forget_failures() == 1 and not list(cache.glob("*.failed"))
    # the same compiler, fixed: with the failure forgotten, the same key builds
    if shutil.which("cc") or shutil.which("gcc"):
        (tmp_path / "ok").mkdir()
        fixed, _ = _fake_cc(tmp_path / "ok", fails=False)
        shutil.copy(fixed, fake)
        assert native_build.build_library("gru").exists()


def test_a_missing_compiler_is_remembered_too(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native_build.BuildError, match="was not found"):
        native_build.build_library("lstm_family")
    with pytest.raises(native_build.BuildError, match="failed before.*was not found"):
        native_build.build_library("lstm_family")
