"""Loading and calling the native kernels (``lstmablate.cells.kernels.native``): ctypes
signatures read from the C sources, calls checked by argument name and tensor type, the
BLAS self-test on load (a wrong BLAS falls back with a clear warning; LP64 and ILP64
interfaces both work), a stale library refused, and each family's library built only when
that family is used.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from lstmablate.cells.kernels import interface
from lstmablate.cells.kernels.common import native, native_build


def _library(family: str) -> native.NativeLibrary:
    lib = native.library(family)
    if lib is None:
        pytest.skip("the native kernels cannot be built here")
    return lib


def _private_copy(family: str, tmp_path) -> str:
    """A copy of the family's library under another path: loaded separately (its own BLAS
    pointers), so what a test hands it cannot disturb the live one."""
    src = _library(family).path
    dst = tmp_path / f"copy-{family}.so"
    shutil.copy(src, dst)
    os.chmod(dst, 0o700)
    return dst


# ---------------------------------------------------------------------------------
# one declaration per function: the C prototypes
# ---------------------------------------------------------------------------------

def test_signatures_come_from_the_c_prototypes():
    decls = native.declarations(native_build.source_text("gru"))
    fwd = decls["gru_fwd"]
    assert [p.name for p in fwd.params] == ["T", "B", "off", "H", "reset_after", "Z", "Hs", "U", "hm",
                                            "w_hh", "bias", "b_hh", "hmask", "R", "par_min"]
    assert [p.kind for p in fwd.params][:5] == ["int", "int", "int*", "int", "int"]
    assert fwd.params[-1].kind == "long"
    assert set(decls) == {"gru_fwd", "gru_bwd", "gemm_check", "step_products", "matmul"}
    so = native.declarations(native_build.source_text("second_order"))
    assert so["multi_fwd"].params[2].kind == "int*"  # Ks
    lay = native.layout_struct(native_build.source_text("lstm_family"))
    assert [f for f, _ in lay._fields_][:4] == ["H", "P", "nb", "nG"]
    assert dict(lay._fields_)["par_min"] is ctypes.c_long
    # every loaded function's argtypes are as long as its C parameter list
    lib = _library("second_order")
    for (name, _dtype), fn in lib._fns.items():
        assert len(fn.argtypes) == len(lib.decls[name].params), name


def test_calls_are_checked_by_name_and_tensor():
    lib = _library("lstm_family")
    A = torch.randn(3, 4)
    W = torch.randn(5, 4)
    C = torch.empty(3, 5)
    lib.call("gemm_check", torch.float32, packed=0, M=3, N=5, K=4, A=A, W=W, C=C)
    torch.testing.assert_close(C, A @ W.t())
    with pytest.raises(TypeError, match=r"missing \['C'\], unexpected \['D'\]"):
        lib.call("gemm_check", torch.float32, packed=0, M=3, N=5, K=4, A=A, W=W, D=C)
    with pytest.raises(TypeError, match="W must be a contiguous CPU torch.float32 tensor, got a "
                                        "torch.float64 tensor"):
        lib.call("gemm_check", torch.float32, packed=0, M=3, N=5, K=4, A=A, W=W.double(), C=C)
    with pytest.raises(TypeError, match="not contiguous"):
        lib.call("gemm_check", torch.float32, packed=0, M=3, N=5, K=4, A=A,
                 W=torch.randn(4, 5).t(), C=C)
    with pytest.raises(TypeError, match="LAYOUT needs exactly"):
        lib.layout(H=1)


# ---------------------------------------------------------------------------------
# the BLAS self-test, with BLAS functions written here
# ---------------------------------------------------------------------------------

_GEMM = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 13))


def _fake_gemm(ctype, np_dtype, int_type, wrong=False):
    """A Fortran ?gemm_ (column-major C = alpha op(A) op(B) + beta C) reading its integer
    arguments as ``int_type`` (c_int32: LP64, c_int64: ILP64); ``wrong``: C = 0."""
    def read(p, t):
        return ctypes.cast(p, ctypes.POINTER(t)).contents.value

    def gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        ta = ctypes.string_at(ta, 1).decode().upper()
        tb = ctypes.string_at(tb, 1).decode().upper()
        m, n, k = (read(p, int_type) for p in (m, n, k))
        lda, ldb, ldc = (read(p, int_type) for p in (lda, ldb, ldc))
        alpha, beta = read(alpha, ctype), read(beta, ctype)

        def mat(p, rows, cols, ld):  # a column-major (rows x cols) view with leading dim ld
            buf = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctype)), shape=(cols * ld,))
            return buf.reshape(cols, ld)[:, :rows].T

        A = mat(a, *((m, k) if ta == "N" else (k, m)), lda)
        B = mat(b, *((k, n) if tb == "N" else (n, k)), ldb)
        Cm = mat(c, m, n, ldc)
        A = A if ta == "N" else A.T
        B = B if tb == "N" else B.T
        prod = alpha * (A.astype(np.float64) @ B)
        Cm[...] = 0 if wrong else (prod if beta == 0 else prod + beta * Cm)  # beta = 0: C unread
    return _GEMM(gemm)


def _fakes(int_type, wrong=False):
    s = _fake_gemm(ctypes.c_float, np.float32, int_type, wrong)
    d = _fake_gemm(ctypes.c_double, np.float64, int_type, wrong)
    return (s, d), (ctypes.cast(s, ctypes.c_void_p).value, ctypes.cast(d, ctypes.c_void_p).value,
                    None, None, None)


@pytest.mark.parametrize("int_type", [ctypes.c_int32, ctypes.c_int64], ids=["LP64", "ILP64"])
def test_self_test_passes_with_an_lp64_or_ilp64_blas(int_type, tmp_path):
    """The kernels pass every BLAS integer zero-extended to 8 bytes, so a BLAS reading 4 or
    8 bytes gets the same numbers: both compute right, and the kernels run with either."""
    keep, ptrs = _fakes(int_type)
    lib = native.NativeLibrary("gru", _private_copy("gru", tmp_path), ptrs)
    lib.self_test()
    assert "mkl-packed" not in lib.modes  # no MKL packing functions were given
    # a whole GRU call through the fake BLAS matches the same call through PyTorch's
    T, B, H = 3, 2, 4
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(T, B, 3 * H, generator=gen)
    w_hh, bias = torch.randn(3 * H, H, generator=gen), torch.randn(3 * H, generator=gen)
    outs = []
    for library in (lib, _library("gru")):
        Hs = torch.zeros(T + 1, B, H)
        library.call("gru_fwd", torch.float32, T=T, B=B, off=[t * B for t in range(T + 1)], H=H,
                     reset_after=0, Z=Z.clone(), Hs=Hs, U=torch.empty(T, B, H), hm=None,
                     w_hh=w_hh, bias=bias, b_hh=None, hmask=None, R=torch.empty(B, 3 * H),
                     par_min=native.PAR_MIN)
        outs.append(Hs)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    del keep


def test_a_wrong_blas_makes_the_kernel_unavailable_with_a_clear_warning(tmp_path, monkeypatch):
    keep, ptrs = _fakes(ctypes.c_int32, wrong=True)
    lib = native.NativeLibrary("gru", _private_copy("gru", tmp_path), ptrs)
    with pytest.raises(native.NativeUnavailable, match="gave wrong results in the native kernels' "
                                                        "self-test"):
        lib.self_test()
    # through library(): one warning, then the PyTorch loops (on another copy: a library's
    # BLAS pointers are process-wide for its path, so the live one must not get the fakes)
    (tmp_path / "second").mkdir()
    copy = _private_copy("gru", tmp_path / "second")
    monkeypatch.setattr(native, "_libraries", {})
    monkeypatch.setattr(native, "blas_pointers", lambda: ptrs)
    monkeypatch.setattr(native_build, "build_library", lambda family: copy)
    with pytest.warns(RuntimeWarning, match="native gru kernel is not available .*wrong results"):
        assert native.library("gru") is None
    del keep


def test_a_wrong_packed_gemm_is_switched_off(tmp_path):
    """MKL's packed GEMM computing garbage: a warning, that path off, the others stay."""
    blas = native.blas_pointers()
    if not all(blas[2:]):
        pytest.skip("no packed GEMM in this PyTorch build")
    size_fn = ctypes.CFUNCTYPE(ctypes.c_size_t, *([ctypes.c_int] * 4))(lambda *a: 64)
    pack_fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 10))(lambda *a: None)

    def compute(layout, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
        ctypes.memset(c, 0, 4 * m * ldc)
    compute_fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p,
                                  ctypes.c_int)(compute)
    ptrs = blas[:2] + tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (size_fn, pack_fn,
                                                                              compute_fn))
    lib = native.NativeLibrary("gru", _private_copy("gru", tmp_path), ptrs)
    if "mkl-packed" not in lib.modes:
        pytest.skip("packing is switched off here (LSTMABLATE_PACKED_GEMM=0)")
    with pytest.warns(RuntimeWarning, match="mkl-packed GEMM gave wrong results"):
        lib.self_test()
    assert "mkl-packed" not in lib.modes and "blas" in lib.modes
    lib.self_test()  # the other paths are right


@pytest.mark.parametrize("mode", ["blas", "mkl-packed", "own-packed"])
def test_every_step_product_path_computes_right(mode):
    """Each per-step product path on shapes that leave partial row tiles and partial
    panels (whole kernel calls in each path, with both operand layouts and accumulation:
    ``native_gemm`` of test_fused_multiplicative.py)."""
    lib = _library("gru")
    if mode not in lib.modes:
        pytest.skip(f"{mode} is not available here")
    old = lib.step_gemm
    try:
        gen = torch.Generator().manual_seed(0)
        for M, N, K in ((1, 1, 1), (7, 33, 5), (9, 47, 130), (20, 100, 37)):
            lib.set_step_gemm(mode)
            A = torch.randn(M, K, generator=gen)
            W = torch.randn(N, K, generator=gen)
            C = torch.full((M, N), float("nan"))
            lib.call("gemm_check", torch.float32, _choose=False, packed=int(mode != "blas"),
                     M=M, N=N, K=K, A=A, W=W, C=C)
            # the float32 dot product's error bound: K roundings of sum |a_k w_k|
            exact = A.double() @ W.double().t()
            bound = K * torch.finfo(torch.float32).eps * (A.double().abs() @ W.double().abs().t())
            assert torch.all((C.double() - exact).abs() <= bound), (M, N, K)
    finally:
        lib.set_step_gemm(old)


@pytest.mark.parametrize("gemm", ["own", "onednn", "mkl"])
def test_call_products_on_each_gemm_compute_right(gemm):
    """A call's large products on each CPU GEMM (``common/gemm.py``; ``own``: our packed GEMM,
    transposing in C): a w^T, a w and a^T b, from operands that are views, on shapes with
    partial row tiles and panels and an empty inner size, within the float32 dot product's
    bound."""
    from lstmablate.cells.kernels.common import gemm as gemms

    if gemm == "onednn" and not gemms.onednn_available():
        pytest.skip("PyTorch without oneDNN")
    lib = _library("gru")
    P = gemms.Products(gemm, lib)
    gen = torch.Generator().manual_seed(0)
    for M, N, K in ((1, 1, 1), (7, 33, 5), (37, 47, 130), (300, 70, 21), (5, 6, 0)):
        a = torch.randn(M + 3, K + 2, generator=gen)[2:-1, 1:-1]  # a view, not contiguous
        w = torch.randn(N, K, generator=gen)
        for got, exact, absolute in (
                (P.nt(a, w), a.double() @ w.double().t(), a.double().abs() @ w.double().abs().t()),
                (P.nn(a, w.t()), a.double() @ w.double().t(),
                 a.double().abs() @ w.double().abs().t()),
                (P.tn(a.t(), w.t()), a.double() @ w.double().t(),
                 a.double().abs() @ w.double().abs().t())):
            bound = max(K, 1) * torch.finfo(torch.float32).eps * absolute
            assert got.shape == (M, N) and torch.all((got.double() - exact).abs() <= bound), (
                M, N, K)
    x, w = torch.randn(9, 5, generator=gen), torch.randn(12, 5, generator=gen)
    for bias in (torch.randn(12, generator=gen), torch.randn(4, generator=gen)):  # (first columns)
        exact = x.double() @ w.double().t()
        exact[:, :bias.shape[0]] += bias.double()
        bound = 6 * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().t()
                                                      + 1)
        assert torch.all((P.linear(x, w, bias).double() - exact).abs() <= bound)


def test_a_stale_library_is_refused(tmp_path):
    """A file under a family's name that was built from other sources: not used."""
    with pytest.raises(native.NativeUnavailable, match="built from other sources"):
        native.NativeLibrary("lstm_family", _private_copy("gru", tmp_path), native.blas_pointers())


# ---------------------------------------------------------------------------------
# each family built and imported only when used
# ---------------------------------------------------------------------------------

_PROBE = r"""
import sys, torch
import lstmablate.cells as cells
def kernels():  # the kernel modules imported so far, e.g. "lstm.family"
    prefix = "lstmablate.cells.kernels."
    return sorted(m[len(prefix):] for m in sys.modules if m.startswith(prefix))
print("import", kernels())
from lstmablate.cells.kernels.common import native
enc = cells.build_encoder("lstm-srnn", 4, 6, num_layers=2)
enc(torch.randn(3, 5, 4))[0].sum().backward()
print("lstm", kernels(), native.loaded_families())
enc = cells.build_encoder("mlstm", 4, 6)
enc(torch.randn(3, 5, 4))[0].sum().backward()
print("mlstm", kernels(), native.loaded_families())
"""


def test_second_order_kernels_are_loaded_only_when_used(tmp_path):
    env = dict(os.environ, LSTMABLATE_KERNEL_CACHE=str(tmp_path / "cache"))
    if native.library("lstm_family") is not None:  # reuse the built libraries (no recompile)
        env["LSTMABLATE_KERNEL_CACHE"] = str(native_build.cache_dir())
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = {ln.split(" ", 1)[0]: ln for ln in out.stdout.splitlines()}
    # importing the cells pulls in no kernel at all (only the switches)
    assert lines["import"] == "import ['switches']", lines["import"]
    # an LSTM-family cell: its kernels, no second-order code, only its library
    assert "'lstm.family'" in lines["lstm"] and "'second_order" not in lines["lstm"], lines["lstm"]
    assert "'gru" not in lines["lstm"]
    built = native.library("lstm_family") is not None
    assert lines["lstm"].endswith("['lstm_family']" if built else "[]"), lines["lstm"]
    # a second-order cell: now its kernels and library
    assert "'second_order.factored'" in lines["mlstm"] and "'second_order.shared'" in lines["mlstm"]
    if built:
        assert lines["mlstm"].endswith("['lstm_family', 'second_order']"), lines["mlstm"]


def test_no_warning_when_the_kernels_build():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for family in interface.native_sources():
            native.library(family)
