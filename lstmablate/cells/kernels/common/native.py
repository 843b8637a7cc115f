"""Loading the native kernels and calling them safely.

:func:`library` gives a kernel family's :class:`NativeLibrary` (building it on first use,
``native_build.py``), or None after one warning when it cannot be used here; the PyTorch loops
then run instead, with the same numbers.

* **One declaration per function**: the ctypes signatures are not written here by hand;
  they are read from the C sources themselves (every ``LA_EXPORT int SFX(name)(...)``
  prototype, and the ``LAYOUT`` struct).  :meth:`NativeLibrary.call` takes the arguments
  by their C names and refuses (TypeError) a missing or unknown argument, or a tensor of
  another dtype, not contiguous or not on the CPU, instead of handing C a bad pointer.
* **The BLAS**: ``sgemm_`` / ``dgemm_`` (and MKL's packed GEMM where exported) of the
  library PyTorch is linked with, so the products run on PyTorch's own threads.  Integer
  arguments reach the BLAS zero-extended to 8 bytes (``la_blas.h``), which is right for an
  LP64 and an ILP64 BLAS alike on a little-endian CPU; a big-endian one gets no native
  kernels.
* **The per-step products** (float32): ``blas`` (sgemm_ every step), ``mkl-packed``
  (MKL's packed GEMM, where PyTorch's BLAS is MKL) or ``own-packed`` (our packed GEMM,
  ``la_gemm.c``).  MKL's is fast on Intel CPUs and slow on AMD ones, ours is
  vendor-neutral, so which one runs is decided per machine and thread count by a short
  timing of each on two representative step products (:meth:`NativeLibrary.choose_step_gemm`,
  cached with the dispatch decisions, ``calibrate.py``);
  ``LSTMABLATE_STEP_GEMM=blas|mkl-packed|own-packed`` fixes it, ``LSTMABLATE_PACKED_GEMM=0``
  means ``blas``.
* **Self-test on load**: a small product through each product path (the BLAS call, and
  each packed GEMM) is compared with ``torch.mm`` in both precisions.  A wrong packed GEMM
  is switched off with a warning (another path stays); a wrong BLAS makes the library
  unusable: a warning, and the PyTorch loops.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..switches import native_enabled, packed_gemm_enabled, step_gemm_setting
from . import calibrate, native_build

#: element-wise work (elements per step) above which a step's rows are split across threads
PAR_MIN = 1 << 10

_SUFFIX = {torch.float32: "f", torch.float64: "d"}
#: the per-step product paths (``la_set_step_gemm`` in ``la_blas.c``)
STEP_MODES = {"blas": 0, "mkl-packed": 1, "own-packed": 2}


class NativeUnavailable(RuntimeError):
    """A native kernel library cannot be used here; the message says why."""


# ---------------------------------------------------------------------------------
# the declarations, read from the C sources
# ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "int", "long", "real*" (a tensor of the library's dtype), "int*", "LAYOUT*"


@dataclass(frozen=True)
class Declaration:
    name: str  # without the _f / _d suffix
    params: tuple[Param, ...]


_EXPORT = re.compile(r"LA_EXPORT\s+int\s+SFX\((\w+)\)\s*\(([^)]*)\)\s*\{", re.S)
_STRUCT = re.compile(r"typedef\s+struct\s*\{([^{}]*)\}\s*LAYOUT\s*;")


def _param(text: str) -> Param:
    text = " ".join(text.replace("const ", " ").split())
    m = re.fullmatch(r"(int|long|real_t|LAYOUT)\s*(\*?)\s*(\w+)", text)
    if m is None:
        raise NativeUnavailable(f"cannot read the C parameter {text!r}")
    ctype, star, name = m.groups()
    kind = {("int", ""): "int", ("long", ""): "long", ("real_t", "*"): "real*",
            ("int", "*"): "int*", ("LAYOUT", "*"): "LAYOUT*"}.get((ctype, star))
    if kind is None:
        raise NativeUnavailable(f"unsupported C parameter type in {text!r}")
    return Param(name, kind)


def declarations(source: str) -> dict[str, Declaration]:
    """Every exported kernel function of a C source (its ``LA_EXPORT int SFX(name)(...)``)."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    out = {}
    for name, params in _EXPORT.findall(source):
        out[name] = Declaration(name, tuple(_param(p) for p in params.split(",") if p.strip()))
    return out


def layout_struct(source: str) -> type[ctypes.Structure] | None:
    """The ctypes mirror of the source's ``LAYOUT`` struct (int and long fields), or None."""
    m = _STRUCT.search(re.sub(r"/\*.*?\*/", " ", source, flags=re.S))
    if m is None:
        return None
    fields = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        ctype, names = decl.split(" ", 1)
        kind = {"int": ctypes.c_int, "long": ctypes.c_long}[ctype]
        fields += [(n.strip(), kind) for n in names.split(",")]
    return type("LAYOUT", (ctypes.Structure,), {"_fields_": fields})


_CTYPES = {"int": ctypes.c_int, "long": ctypes.c_long, "real*": ctypes.c_void_p,
           "int*": ctypes.POINTER(ctypes.c_int), "LAYOUT*": ctypes.c_void_p}


# ---------------------------------------------------------------------------------
# the BLAS PyTorch uses
# ---------------------------------------------------------------------------------

def _address(lib: ctypes.CDLL, name: str) -> int | None:
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


_blas_cache: dict = {}


def blas_pointers() -> tuple:
    """Addresses of sgemm_, dgemm_ and MKL's three packed-GEMM functions (None where not
    exported) in the library PyTorch's BLAS lives in; raises NativeUnavailable if
    sgemm_/dgemm_ are not exported."""
    if "ptrs" not in _blas_cache:
        libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
        found = None
        for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "libtorch.so"):
            path = os.path.join(libdir, name)
            if not os.path.exists(path):
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            gemm = (_address(lib, "sgemm_"), _address(lib, "dgemm_"))
            if all(gemm):
                packed = tuple(_address(lib, n) for n in ("cblas_sgemm_pack_get_size",
                                                            "cblas_sgemm_pack", "cblas_sgemm_compute"))
                found = gemm + (packed if all(packed) else (None, None, None))
                break
        _blas_cache["ptrs"] = found
    if _blas_cache["ptrs"] is None:
        raise NativeUnavailable("PyTorch's BLAS (sgemm_/dgemm_) is not exported by libtorch_cpu")
    return _blas_cache["ptrs"]


# ---------------------------------------------------------------------------------
# a loaded library
# ---------------------------------------------------------------------------------

class NativeLibrary:
    """One kernel family's compiled library: its functions, declared from the C source.

    The library's C state (the BLAS pointers, the per-step product path) belongs to the
    loaded file, so there is one object per path (:func:`library`); another object for the
    same path would change it under the first."""

    def __init__(self, family: str, path: Path, blas: tuple):
        self.family, self.path = family, path
        source = native_build.source_text(family)
        self.decls = declarations(source)
        self.Layout = layout_struct(source)
        native_build.check_private_file(path)
        self.lib = ctypes.CDLL(str(path))
        self.lib.la_version.restype = ctypes.c_long
        self.lib.la_version.argtypes = []
        if self.lib.la_version() != native_build.source_version(family):
            raise NativeUnavailable(f"{path} was built from other sources (stale)")
        for f in ("la_init", "la_init_packed"):
            getattr(self.lib, f).restype = None
        self.lib.la_init.argtypes = [ctypes.c_void_p] * 2
        self.lib.la_init_packed.argtypes = [ctypes.c_void_p] * 3
        self.lib.la_set_step_gemm.argtypes = [ctypes.c_int]
        self.lib.la_set_step_gemm.restype = ctypes.c_int
        self._fns = {}
        for d in self.decls.values():
            for dtype, sfx in _SUFFIX.items():
                fn = getattr(self.lib, f"{d.name}_{sfx}")
                fn.argtypes = [_CTYPES[p.kind] for p in d.params]
                fn.restype = ctypes.c_int
                self._fns[d.name, dtype] = fn
        self.lib.la_init(*blas[:2])
        mkl = bool(all(blas[2:]))
        self.lib.la_init_packed(*(blas[2:] if mkl else (None, None, None)))
        #: the per-step product paths usable here (the self-test may remove some)
        self.modes = ["blas"] + ((["mkl-packed"] if mkl else []) + ["own-packed"]
                                 if packed_gemm_enabled() else [])
        self.step_gemm = self.set_step_gemm("blas")
        self._step_gemm_threads: int | None = None

    def set_step_gemm(self, mode: str) -> str:
        """Run the float32 per-step products with ``mode`` (``STEP_MODES``); returns the
        mode in force."""
        code = self.lib.la_set_step_gemm(STEP_MODES[mode])
        self.step_gemm = next(m for m, c in STEP_MODES.items() if c == code)
        return self.step_gemm

    def time_step_gemm(self, mode: str, M: int, N: int, K: int, reps: int) -> float:
        """Seconds for ``reps`` float32 step products (M x K) . (K x N) in ``mode``, the
        weight packed once (as in a call)."""
        gen = torch.Generator().manual_seed(0)
        A, W = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
        C = torch.empty(M, N)
        old = self.step_gemm
        self.set_step_gemm(mode)
        try:
            t0 = time.perf_counter()
            self.call("step_products", torch.float32, reps=reps, M=M, N=N, K=K, A=A, W=W, C=C,
                      _choose=False)
            return time.perf_counter() - t0
        finally:
            self.set_step_gemm(old)

    def choose_step_gemm(self) -> str:
        """Set the per-step product path for the current thread count: the environment's
        (``LSTMABLATE_STEP_GEMM``), else the fastest by the per-machine timing."""
        threads = torch.get_num_threads()
        if self._step_gemm_threads == threads:
            return self.step_gemm
        self._step_gemm_threads = threads
        forced = step_gemm_setting()
        if forced != "auto":
            return self.set_step_gemm(forced if forced in self.modes else "blas")
        if len(self.modes) == 1:
            return self.set_step_gemm(self.modes[0])
        return self.set_step_gemm(calibrate.choose_step_gemm(self, threads))

    def layout(self, **fields) -> ctypes.Structure:
        """A ``LAYOUT`` value (every field by name)."""
        names = {f for f, _ in self.Layout._fields_}
        if set(fields) != names:
            raise TypeError(f"LAYOUT needs exactly {sorted(names)}, got {sorted(fields)}")
        return self.Layout(**fields)

    def call(self, name: str, dtype: torch.dtype, _choose: bool = True, **args) -> None:
        """Call ``name`` (the float32 or float64 variant) with its arguments by C name
        (first setting the per-step product path for the current thread count)."""
        if _choose and dtype == torch.float32:
            self.choose_step_gemm()
        decl = self.decls[name]
        expected = [p.name for p in decl.params]
        if set(args) != set(expected):
            missing = sorted(set(expected) - set(args))
            extra = sorted(set(args) - set(expected))
            raise TypeError(f"{self.family}.{name}: missing {missing}, unexpected {extra}")
        values, keep = [], []
        for p in decl.params:
            v = args[p.name]
            if p.kind == "real*":
                if v is None:
                    values.append(None)
                    continue
                if not (isinstance(v, torch.Tensor) and v.dtype == dtype and v.device.type == "cpu"
                        and v.is_contiguous()):
                    raise TypeError(f"{self.family}.{name}: {p.name} must be a contiguous CPU "
                                    f"{dtype} tensor, got {_describe(v)}")
                values.append(v.data_ptr())
            elif p.kind == "int*":
                arr = (ctypes.c_int * len(v))(*[int(i) for i in v])
                keep.append(arr)
                values.append(arr)
            elif p.kind == "LAYOUT*":
                if not isinstance(v, self.Layout):
                    raise TypeError(f"{self.family}.{name}: {p.name} must be a LAYOUT (layout())")
                keep.append(v)
                values.append(ctypes.addressof(v))
            else:
                values.append(int(v))
        rc = self._fns[name, dtype](*values)
        if rc != 0:
            raise RuntimeError(f"native kernel {self.family}.{name} returned {rc}")

    def self_test(self) -> None:
        """Small products through every product path against torch.mm (module doc)."""
        gen = torch.Generator().manual_seed(0)
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
            modes = [m for m in self.modes if m != "blas"] if dtype == torch.float32 else []
            for M, N, K in ((3, 5, 7), (20, 33, 17), (9, 70, 40)):
                A = torch.randn(M, K, generator=gen, dtype=dtype)
                W = torch.randn(N, K, generator=gen, dtype=dtype)
                want = (A.double() @ W.double().t())
                bound = tol * max(float(want.abs().max()), 1.0) * K
                if not self._check(0, A, W, want, bound):
                    raise NativeUnavailable(
                        f"the BLAS PyTorch is linked with gave wrong results in the native "
                        f"kernels' self-test ({dtype}, {M}x{N}x{K} product against torch.mm); "
                        "is it an unusual BLAS?")
                for mode in modes:
                    self.set_step_gemm(mode)
                    if self.step_gemm != mode or not self._check(1, A, W, want, bound):
                        warnings.warn(
                            f"lstmablate: the {mode} GEMM gave wrong results in the native "
                            f"kernels' self-test ({M}x{N}x{K}); it is switched off (another path "
                            "runs the per-step products).", RuntimeWarning, stacklevel=4)
                        self.modes.remove(mode)
                modes = [m for m in self.modes if m != "blas"] if dtype == torch.float32 else []
        self.set_step_gemm("blas")

    def _check(self, packed: int, A, W, want, bound) -> bool:
        C = torch.full((A.shape[0], W.shape[0]), float("nan"), dtype=A.dtype)
        try:
            self.call("gemm_check", A.dtype, _choose=False, packed=packed, M=A.shape[0],
                      N=W.shape[0], K=A.shape[1], A=A, W=W, C=C)
        except RuntimeError:  # the path could not run (no packing memory)
            return False
        err = float((C.double() - want).abs().max())
        return err == err and err <= bound  # (err == err: not NaN)


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return (f"a {v.dtype} tensor on {v.device}"
                + ("" if v.is_contiguous() else ", not contiguous"))
    return type(v).__name__


# ---------------------------------------------------------------------------------
# one library per family, built and loaded on first use
# ---------------------------------------------------------------------------------

_libraries: dict[str, NativeLibrary | None] = {}


def _load(family: str) -> NativeLibrary:
    if sys.byteorder != "little":
        raise NativeUnavailable("the native kernels need a little-endian CPU")
    blas = blas_pointers()
    try:
        path = native_build.build_library(family)
    except native_build.BuildError as err:
        raise NativeUnavailable(str(err)) from None
    try:
        lib = NativeLibrary(family, path, blas)
    except (native_build.BuildError, OSError, AttributeError) as err:
        raise NativeUnavailable(f"{path} cannot be loaded: {err}") from None
    lib.self_test()
    return lib


def library(family: str) -> NativeLibrary | None:
    """``family``'s native library ("lstm_family", "gru", "second_order"), building it on
    first use; None (after one warning) if it cannot be used here, or with
    ``LSTMABLATE_NATIVE=0``."""
    if not native_enabled():
        return None
    if family not in _libraries:
        try:
            _libraries[family] = _load(family)
        except NativeUnavailable as err:  # fall back, once, loudly
            _libraries[family] = None
            warnings.warn(f"lstmablate: the native {family} kernel is not available ({err}); "
                          "using the PyTorch kernels, which are slower for small hidden sizes. "
                          "Set LSTMABLATE_NATIVE=0 to silence this.", RuntimeWarning, stacklevel=3)
    return _libraries[family]


def library_for(family: str, device_type: str, dtype: torch.dtype) -> NativeLibrary | None:
    """``family``'s library if it runs calls on this device and dtype (CPU, float32 /
    float64, and it builds here), else None."""
    if device_type != "cpu" or dtype not in _SUFFIX:
        return None
    return library(family)


def loaded_families() -> list[str]:
    """The families whose libraries this process has loaded (for tests and ``bench``)."""
    return sorted(f for f, lib in _libraries.items() if lib is not None)
