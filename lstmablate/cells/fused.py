"""Fast sequence kernels for the registry cells (the "fast paths").

Every cell keeps its plain reference implementation (``Cell.forward``: one
``step`` per time step, autograd through every operation); a cell that has a
fast path (the LSTM family, the GRU) dispatches to it from its own ``forward``
unless the reference is forced, and ``tests/test_fused.py`` compares the two.
Forcing the reference:

* ``with lstmablate.cells.fused.reference_mode(): ...`` (a context manager;
  ``reference_mode(False)`` forces the fast paths back on inside it);
* ``set_reference_mode(True)`` (module-wide; ``None`` follows the env var again);
* the environment variable ``LSTMABLATE_REFERENCE=1`` (read at every call).

Which kernel a call takes is :func:`plan` (LSTM family) / :func:`gru_plan`, pure
functions of the cell and the call (device, dtype, mask kind, recurrent
dropout), so the CUDA selection is tested without a GPU:

``recurrent`` / ``scan``: custom autograd functions with the backward (BPTT)
    written by hand.  All input-side products of all steps in ONE matrix
    product; per step ONE product with ``weight_hh``, which holds only the
    blocks that read h_{t-1} (3H rows instead of 4H for ``lstm-srnn``; none at
    all for ``lstm-srnn-hidden``, whose memory cell is then a linear
    element-wise scan); the weight gradients are ONE matrix product each over
    all steps after the reverse loop.  Two implementations of the loops:

    - the **native kernel** (CPU, float32/float64, the default there): both
      loops in plain C, compiled once per machine with the system compiler and
      cached (see "the native kernel" below); per-step products through MKL's
      packed GEMM, the element-wise work of a step one fused, vectorised pass;
    - the **PyTorch loops** (any device; CUDA, or no compiler): the same
      algorithm with in-place PyTorch operations on preallocated buffers.

``torch-lstm`` / ``torch-rnn`` / ``torch-gru``: ``lstm`` (``lstm-gates``, the
    GRU with ``reset_after``) is exactly what ``torch.nn.LSTM`` (``RNN``,
    ``GRU``) computes, so on CUDA it goes to PyTorch's fused kernels (cuDNN)
    through ``torch._VF``.  Our row blocks i, f, o, g are swapped to PyTorch's
    i, f, g, o by a small autograd function, our single bias becomes
    ``bias_ih`` and ``bias_hh`` is a constant zero, so the gradients land on
    our own parameters.  On CPU the native kernel is faster than oneDNN's LSTM,
    so delegation happens there only without it (or with
    ``LSTMABLATE_TORCH_ON_CPU=1``).

Padding: the encoder's masks are *prefix* masks (each sequence is real up to
its length).  The hand-written kernels run every row over all T steps and then
take each sequence's final state at its last real step (its initial state when
the length is 0) and zero the outputs at padding.  Nothing after a sequence's
end feeds anything the caller sees, so outputs, final states and all gradients
are exactly those of the reference loop (which carries the state through
padding), and the loops have no masking work.  The delegated kernels use packed
sequences.  A mask that is not a prefix mask (holes) falls back to the
reference loop, as do autocast and CPU dtypes other than float32/float64.

Recurrent dropout (``h_mask``) and ``proj_size`` are supported by the
hand-written kernels.  The second-order cells (``mrnn``, ``mlstm``, ``mmrnn``,
``mmlstm``, ``dyck-rnn``) have their own kernels in ``fused_multiplicative.py``;
the native loops of ``mrnn``, ``mlstm``, ``mmrnn``, ``mmlstm`` are part of the native
kernel built here.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

State = tuple[Tensor, ...]

# ---------------------------------------------------------------------------------
# switching between the fast paths and the reference loop
# ---------------------------------------------------------------------------------

_reference_forced: bool | None = None  # None: follow LSTMABLATE_REFERENCE


def set_reference_mode(enabled: bool | None) -> None:
    """Force the reference loop (True), the fast paths (False), or follow the env var (None)."""
    global _reference_forced
    _reference_forced = enabled


@contextmanager
def reference_mode(enabled: bool = True) -> Iterator[None]:
    """Run every cell's plain reference loop inside the block (``enabled=False``: the fast paths)."""
    global _reference_forced
    old = _reference_forced
    _reference_forced = enabled
    try:
        yield
    finally:
        _reference_forced = old


def reference_forced() -> bool:
    """True if the reference loop is forced (switch, context manager or LSTMABLATE_REFERENCE=1)."""
    if _reference_forced is not None:
        return _reference_forced
    return os.environ.get("LSTMABLATE_REFERENCE", "").strip().lower() not in ("", "0", "false", "no")


# ---------------------------------------------------------------------------------
# masks and path selection
# ---------------------------------------------------------------------------------

def mask_kind(mask: Tensor | None) -> tuple[str, Tensor | None]:
    """Classify a (T, B) mask: ("none", None), ("prefix", lengths), ("prefix0", lengths)
    when some length is 0, or ("other", None) for masks with holes / non-0/1 values."""
    if mask is None:
        return "none", None
    T = mask.shape[0]
    if mask.dim() != 2:
        return "other", None
    if not mask.is_floating_point():
        mask = mask.float()
    lengths = mask.sum(0).round().long()
    steps = torch.arange(T, device=mask.device).unsqueeze(1)
    if not torch.equal((steps < lengths.unsqueeze(0)).to(mask.dtype), mask):
        return "other", None
    if mask.shape[1] and bool((lengths == mask.shape[0]).all()):
        return "none", None
    if mask.shape[1] and bool((lengths == 0).any()):
        return "prefix0", lengths
    return "prefix", lengths


def _autocast_on(x: Tensor) -> bool:
    """Is autocast active for x's device (any PyTorch 2.x)?"""
    try:
        return bool(torch.is_autocast_enabled(x.device.type))
    except TypeError:  # PyTorch < 2.4: no device argument
        if x.device.type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def _is_plain_lstm(cell) -> bool:
    return (cell.memory_cell and cell.content == "srnn" and cell.use_forget_gate
            and cell.use_output_gate and cell.gates_see_hidden)


#: on CPU, run ``lstm`` / ``lstm-gates`` through PyTorch's own kernels (oneDNN / ATen)
#: rather than the native kernel; "auto": only when the native kernel is unavailable
TORCH_ON_CPU = os.environ.get("LSTMABLATE_TORCH_ON_CPU", "auto")


def plan(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
         mask: str = "none", h_mask: bool = False, autocast: bool = False,
         reference: bool | None = None, native: bool | None = None) -> str:
    """Which kernel an LSTM-family call runs: ``torch-lstm``, ``torch-rnn``,
    ``recurrent``, ``scan`` or ``reference``.

    ``mask`` is the :func:`mask_kind` of the call's mask; ``reference`` (default:
    :func:`reference_forced`) forces the reference loop.  On CUDA ``torch-lstm``
    and ``torch-rnn`` are cuDNN; on CPU oneDNN (float32) or ATen's native loop.
    """
    if reference is None:
        reference = reference_forced()
    if device_type == "cpu" and TORCH_ON_CPU != "1":
        if native is None:
            native = native_kernel_for(device_type, dtype) is not None
        prefer_torch = not native
    else:
        prefer_torch = True
    if reference or autocast or mask == "other" or not dtype.is_floating_point:
        return "reference"
    if dtype not in (torch.float32, torch.float64) and device_type == "cpu":
        return "reference"  # the CPU kernels are written for fp32 / fp64
    if not cell.memory_cell:  # eq 1, the S-RNN: exactly torch.nn.RNN(tanh)
        return "torch-rnn" if prefer_torch and not h_mask and mask != "prefix0" else "recurrent"
    if _is_plain_lstm(cell) and prefer_torch and not h_mask and mask != "prefix0" and (
            not cell.proj_size or device_type == "cuda"):  # oneDNN has no projection
        return "torch-lstm"
    if cell.weight_hh is None:  # nothing reads h_{t-1}: a linear scan
        return "scan"
    return "recurrent"


def fast_path_available(cell) -> bool:
    """Does this cell (an LSTM-family cell) have a fast path for a plain float32 CPU call?"""
    return plan(cell, reference=False, native=False) != "reference"


def lstm_family_forward(cell, x: Tensor, state: State | None, mask: Tensor | None,
                        h_mask: Tensor | None) -> tuple[Tensor, State] | None:
    """The fast path of :class:`~lstmablate.cells.lstm.LSTMFamilyCell`, or None
    (the caller then runs the reference loop)."""
    if reference_forced():
        return None
    kind, lengths = mask_kind(mask)
    autocast = _autocast_on(x)
    path = plan(cell, device_type=x.device.type, dtype=x.dtype, mask=kind,
                h_mask=h_mask is not None, autocast=autocast)
    if path == "reference" or x.dim() != 3:
        return None
    T, B = x.shape[0], x.shape[1]
    if state is None:
        state = cell.initial_state(B, x)
    if T == 0:
        return x.new_zeros(0, B, cell.output_size), tuple(state)
    if path == "torch-lstm":
        return _torch_lstm(cell, x, state, lengths)
    if path == "torch-rnn":
        return _torch_rnn(cell, x, state, lengths)
    if path == "scan":
        return _scan(cell, x, state, lengths)
    return _recurrent(cell, x, state, lengths, h_mask)


# ---------------------------------------------------------------------------------
# delegation to PyTorch's fused LSTM / RNN (oneDNN / cuDNN)
# ---------------------------------------------------------------------------------

class _PermuteBlocks(torch.autograd.Function):
    """Swap the last two H-row blocks of a 4-block weight or bias (ours i, f, o, g <->
    PyTorch's i, f, g, o): one concatenation forward, the same one backward."""

    @staticmethod
    def _swap(w: Tensor) -> Tensor:
        n = w.shape[0] // 4
        return torch.cat([w[:2 * n], w[3 * n:], w[2 * n:3 * n]])

    @staticmethod
    def forward(ctx, w: Tensor) -> Tensor:
        return _PermuteBlocks._swap(w)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _PermuteBlocks._swap(grad)


def _torch_lstm_weights(cell) -> list[Tensor]:
    H = cell.hidden_size
    w_ih = _PermuteBlocks.apply(cell.weight_ih)
    w_hh = _PermuteBlocks.apply(cell.weight_hh)
    b = cell.bias
    if b.shape[0] == 3 * H:  # content_bias=False: b_i, b_f, b_o and no b_g
        b = torch.cat([b, b.new_zeros(H)])
    b_ih = _PermuteBlocks.apply(b)
    ws = [w_ih, w_hh, b_ih, b_ih.new_zeros(4 * H).detach()]
    if cell.weight_hr is not None:
        ws.append(cell.weight_hr)
    return ws


def _run_vf(fn, x: Tensor, hx, weights: list[Tensor], has_biases: bool,
            lengths: Tensor | None):
    """Call a ``torch._VF`` RNN (one layer, one direction), padded or packed."""
    if lengths is None:
        return fn(x, hx, weights, has_biases, 1, 0.0, torch.is_grad_enabled(), False, False)
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
    idx = packed.sorted_indices
    hx_sorted = tuple(h.index_select(1, idx) for h in hx) if isinstance(hx, tuple) \
        else hx.index_select(1, idx)
    res = fn(packed.data, packed.batch_sizes, hx_sorted, weights, has_biases, 1, 0.0,
             torch.is_grad_enabled(), False)
    out = type(packed)(res[0], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    out, _ = pad_packed_sequence(out, total_length=x.shape[0])
    inv = packed.unsorted_indices
    return (out,) + tuple(s.index_select(1, inv) for s in res[1:])


def _cuda_quiet(x: Tensor):
    """cuDNN warns that our (freshly permuted) weights are not one flat buffer; they never are."""
    import warnings

    ctx = warnings.catch_warnings()
    if x.is_cuda:
        ctx.__enter__()
        warnings.filterwarnings("ignore", message=".*contiguous chunk of memory.*")
        return ctx
    return None


def _torch_lstm(cell, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    h0, c0 = state
    weights = _torch_lstm_weights(cell)
    quiet = _cuda_quiet(x)
    try:
        out, hn, cn = _run_vf(torch._VF.lstm, x, (h0.unsqueeze(0), c0.unsqueeze(0)), weights,
                              True, lengths)
    finally:
        if quiet is not None:
            quiet.__exit__(None, None, None)
    return out, (hn[0], cn[0])


def _torch_rnn(cell, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    weights = [cell.weight_ih, cell.weight_hh]
    if cell.bias is not None:
        weights += [cell.bias, cell.bias.new_zeros(cell.bias.shape).detach()]
    quiet = _cuda_quiet(x)
    try:
        out, hn = _run_vf(torch._VF.rnn_tanh, x, state[0].unsqueeze(0), weights,
                          cell.bias is not None, lengths)
    finally:
        if quiet is not None:
            quiet.__exit__(None, None, None)
    return out, (hn[0],)


# ---------------------------------------------------------------------------------
# helpers shared by the hand-written kernels
# ---------------------------------------------------------------------------------

def _input_products(x: Tensor, w_ih: Tensor, bias: Tensor | None) -> Tensor:
    """x_t W_ih^T (+ bias on the first bias.numel() columns) for all steps: (T, B, n*H)."""
    T, B, _ = x.shape
    x2 = x.reshape(T * B, -1)
    if bias is not None and bias.shape[0] == w_ih.shape[0]:
        z = torch.addmm(bias, x2, w_ih.t())
    else:
        z = torch.mm(x2, w_ih.t())
        if bias is not None:
            z[:, :bias.shape[0]] += bias
    return z.view(T, B, -1)


def _final(buf: Tensor, lengths: Tensor | None) -> Tensor:
    """buf (T+1, B, n) holds the states after steps 0..T (buf[0]: initial); take each row's last real one."""
    if lengths is None:
        return buf[-1].clone()
    return buf[lengths, torch.arange(buf.shape[1], device=buf.device)]


def _outputs(Hs: Tensor, C: Tensor | None, lengths: Tensor | None
             ) -> tuple[Tensor, Tensor, Tensor | None]:
    """What a kernel returns from its buffers Hs (T+1, B, H) and C (T+1, B, H) or None: the
    outputs (zero at padding), h_n and c_n at each row's last real step."""
    return (_masked_outputs(Hs[1:], lengths), _final(Hs, lengths),
            _final(C, lengths) if C is not None else None)


def _masked_outputs(out: Tensor, lengths: Tensor | None) -> Tensor:
    if lengths is None:
        return out.clone()
    T = out.shape[0]
    pad = torch.arange(T, device=out.device).unsqueeze(1) >= lengths.unsqueeze(0)  # (T, B)
    return out.masked_fill(pad.unsqueeze(-1), 0.0)


def _state_grads_into_steps(dout: Tensor | None, dfinal: Tensor | None, lengths: Tensor | None,
                            like: Tensor) -> tuple[Tensor, Tensor | None]:
    """Fold the gradient of a final state into a (T, B, n) per-step gradient.

    Returns (per-step gradient, the part that goes straight to the initial
    state: rows whose length is 0, else None).  Gradients of padded outputs are
    dropped (those outputs are constant zeros).
    """
    T, B = like.shape[0], like.shape[1]
    g = like.new_zeros(like.shape) if dout is None else dout.clone(
        memory_format=torch.contiguous_format)
    direct = None
    if lengths is not None:
        pad = torch.arange(T, device=g.device).unsqueeze(1) >= lengths.unsqueeze(0)
        g.masked_fill_(pad.unsqueeze(-1), 0.0)
    if dfinal is None:
        return g, None
    if lengths is None:
        g[-1] += dfinal
        return g, None
    rows = torch.arange(B, device=g.device)
    real = lengths > 0
    g.index_put_((lengths.clamp(min=1) - 1, rows), dfinal * real.unsqueeze(-1).to(dfinal.dtype),
                 accumulate=True)
    if not bool(real.all()):
        direct = dfinal * (~real).unsqueeze(-1).to(dfinal.dtype)
    return g, direct


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


# ---------------------------------------------------------------------------------
# the native kernel: the whole recurrence loop (forward and BPTT) in plain C
# ---------------------------------------------------------------------------------
#
# Plain C, no PyTorch headers: it compiles in about a second with the system C
# compiler, once per machine, and is cached on disk (``LSTMABLATE_KERNEL_CACHE``,
# default ``~/.cache/lstmablate/kernels``).  Its matrix products call the BLAS
# PyTorch itself uses (``sgemm_`` / ``dgemm_`` of libtorch_cpu, passed in as
# function pointers), so they run on PyTorch's threads; the element-wise work of
# a step is one fused pass (OpenMP-parallel over rows when it is large).  No
# compiler, no BLAS symbols, or ``LSTMABLATE_NATIVE=0``: the PyTorch loops above
# are used instead (with a one-time warning in the first two cases).

_NATIVE_VERSION = 6
_C_HEADER = r"""/* lstmablate fused kernels: plain C (no PyTorch headers), compiled once and cached by
   lstmablate/cells/fused.py.  GEMMs go to the BLAS that PyTorch itself uses (sgemm_/dgemm_,
   passed in as function pointers by la_init); element-wise work is fused, one pass per step. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {{ int H, P, nb, nG, fi, oi, r0, r1, srnn, memory, nbias; long par_min; }} LAYOUT;

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*,
                        const float*, const int*, const float*, const int*, const float*, float*, const int*);
typedef void (*dgemm_t)(const char*, const char*, const int*, const int*, const int*, const double*,
                        const double*, const int*, const double*, const int*, const double*, double*, const int*);
static sgemm_t SGEMM_PTR = 0;
static dgemm_t DGEMM_PTR = 0;

int la_init(void* s, void* d) {{ SGEMM_PTR = (sgemm_t)s; DGEMM_PTR = (dgemm_t)d; return {version}; }}

/* MKL's packed GEMM (float32): a weight packed once per call is reused by every step's product,
   which is what makes the small per-step products (B rows) fast.  Optional: without it the
   steps call sgemm_. */
typedef size_t (*pack_size_t)(int, int, int, int);
typedef void (*pack_t)(int, int, int, int, int, int, float, const float*, int, float*);
typedef void (*compute_t)(int, int, int, int, int, int, const float*, int, const float*, int, float,
                          float*, int);
static pack_size_t PACK_SIZE = 0;
static pack_t PACK = 0;
static compute_t COMPUTE = 0;
int la_init_packed(void* a, void* b, void* c) {{
    PACK_SIZE = (pack_size_t)a; PACK = (pack_t)b; COMPUTE = (compute_t)c; return 0;
}}
enum {{ ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162 }};

/* Pack W for products C (M x N) = A (M x K) . op(W): tb = 1: W is (N x K) and op(W) = W^T;
   tb = 0: W is (K x N).  Returns 0 (use sgemm_) when packing is unavailable. */
static float* la_pack(int tb, int M, int N, int K, const float* W, int ldw) {{
    if (!PACK || M <= 0 || N <= 0 || K <= 0) return 0;
    float* buf = (float*)malloc(PACK_SIZE(B_MATRIX, M, N, K));
    if (buf) PACK(ROW_MAJOR, B_MATRIX, tb ? TRANS : NO_TRANS, M, N, K, 1.0f, W, ldw, buf);
    return buf;
}}

static void la_packed_mm(int M, int N, int K, const float* A, int lda, const float* packed, float beta,
                         float* Cm, int ldc) {{
    COMPUTE(ROW_MAJOR, NO_TRANS, PACKED, M, N, K, A, lda, packed, N, beta, Cm, ldc);
}}

/* exp for float32: Cody-Waite reduction + the Cephes polynomial (about 1 ulp), written so that
   the compiler vectorises it (no calls, no branches). */
static inline float la_expf(float x) {{
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}}

/* tanh for float32 (Cephes tanhf): an odd polynomial below 0.625, else 1 - 2/(exp(2|x|)+1). */
static inline float la_tanhf(float x) {{
    float a = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
                    + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
    float big = 1.0f - 2.0f / (la_expf(2.0f * a) + 1.0f);
    big = copysignf(big, x);
    return a < 0.625f ? small : big;
}}
"""

_C_BODY = r"""/* lstmablate fused LSTM-family kernels ({real}).  Generated from lstmablate/cells/fused.py. */

static inline {real} SFX(sig)({real} x) {{ return ({real})1 / (({real})1 + EXP(-x)); }}

/* row-major C (M x N) = A (M x K) . op(B) + beta C;  tb: B is given as W (N x K), i.e. C = A W^T */
static void SFX(gemm)(int tb, int M, int N, int K, const {real}* A, int lda, const {real}* Bm, int ldb,
                      {real} beta, {real}* Cm, int ldc) {{
    const {real} one = 1;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {{ for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) Cm[(long)m * ldc + n] *= beta; return; }}
    GEMM(tb ? "T" : "N", "N", &N, &M, &K, &one, Bm, &ldb, A, &lda, &beta, Cm, &ldc);
}}

/* One per-step product C (M x N) (beta = 0: =, 1: +=) A op(W): MKL's packed GEMM when the
   weight was packed (pk, float32 only), else the BLAS; pk is not evaluated without packing. */
#if CAN_PACK
#define STEP_MM(pk, tb, M, N, K, a, lda, w, ldw, beta, c, ldc) \
    do {{ if (pk) la_packed_mm(M, N, K, a, lda, pk, beta, c, ldc); \
          else SFX(gemm)(tb, M, N, K, a, lda, w, ldw, beta, c, ldc); }} while (0)
#else
#define STEP_MM(pk, tb, M, N, K, a, lda, w, ldw, beta, c, ldc) \
    SFX(gemm)(tb, M, N, K, a, lda, w, ldw, beta, c, ldc)
#endif

/* h' = h_{{t-1}} * h_mask, written to hm (kept for the weight gradients); h_{{t-1}} itself
   without recurrent dropout (hmask = 0). */
static inline const {real}* SFX(dropped)(const {real}* hp, const {real}* hmask, {real}* hm, long n) {{
    if (!hmask) return hp;
    for (long e = 0; e < n; ++e) hm[e] = hp[e] * hmask[e];
    return hm;
}}

/* target = src * mask, or += when accumulate (dh_{{t-1}} from dh' under recurrent dropout) */
static inline void SFX(add_masked)({real}* target, const {real}* src, const {real}* mask, long n,
                                   int accumulate) {{
    if (accumulate) for (long e = 0; e < n; ++e) target[e] += src[e] * mask[e];
    else for (long e = 0; e < n; ++e) target[e] = src[e] * mask[e];
}}

/* One row (b) of one step of the forward element-wise work; HAS_F, HAS_O, SRNN are constants at
   every call site (see fwd_row), so each combination compiles to its own branch-free loop. */
static inline __attribute__((always_inline)) void SFX(fwd_row_impl)(
        const int HAS_F, const int HAS_O, const int SRNN, const int H, {real}* z, int fi, int oi, int nG,
        const {real}* cp, {real}* c, {real}* tc, {real}* h) {{
    {real}* zi = z;
    {real}* zf = z + (HAS_F ? fi : 0) * H;
    {real}* zo = z + (HAS_O ? oi : 0) * H;
    {real}* zg = z + nG * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {{
        {real} i = SFX(sig)(zi[j]);
        {real} g = SRNN ? TANH(zg[j]) : zg[j];
        {real} cc = i * g;
        {real} f = 1, o = 1;
        if (HAS_F) {{ f = SFX(sig)(zf[j]); cc += f * cp[j]; }} else cc += cp[j];
        if (HAS_O) o = SFX(sig)(zo[j]);
        {real} t = TANH(cc);
        zi[j] = i;
        if (SRNN) zg[j] = g;
        if (HAS_F) zf[j] = f;
        if (HAS_O) zo[j] = o;
        c[j] = cc;
        tc[j] = t;
        h[j] = HAS_O ? o * t : t;
    }}
}}

static void SFX(fwd_row)(const LAYOUT* L, {real}* z, const {real}* bias, const {real}* cp, {real}* c,
                         {real}* tc, {real}* h) {{
    const int H = L->H, fi = L->fi, oi = L->oi, nG = L->nG, nbias = L->nbias;
    if (bias) {{
        #pragma omp simd
        for (int j = 0; j < nbias; ++j) z[j] += bias[j];
    }}
    if (!L->memory) {{
        {real}* zg = z + nG * H;
        #pragma omp simd
        for (int j = 0; j < H; ++j) {{ {real} v = TANH(zg[j]); zg[j] = v; h[j] = v; }}
        return;
    }}
    switch ((fi >= 0) * 4 + (oi >= 0) * 2 + (L->srnn != 0)) {{
        case 7: SFX(fwd_row_impl)(1, 1, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 6: SFX(fwd_row_impl)(1, 1, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 5: SFX(fwd_row_impl)(1, 0, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 4: SFX(fwd_row_impl)(1, 0, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 3: SFX(fwd_row_impl)(0, 1, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 2: SFX(fwd_row_impl)(0, 1, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 1: SFX(fwd_row_impl)(0, 0, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        default: SFX(fwd_row_impl)(0, 0, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
    }}
}}

/* Forward over T steps.  Z (T,B,nb*H): x_t W_ih^T in (bias, if given, is added to the first
   nbias columns here), activations out; Hs (T+1,B,P) with
   Hs[0] = h0; C (T+1,B,H) with C[0] = c0; TC (T,B,H); HH (T,B,H) if proj (h before W_hr);
   HM (T,B,P) if hmask (h_{{t-1}} * hmask). */
int SFX(lstm_fwd)(const LAYOUT* L, int T, int B, {real}* Z, {real}* Hs, {real}* C, {real}* TC,
                  {real}* HH, {real}* HM, const {real}* w_hh, const {real}* w_hr, const {real}* hmask,
                  const {real}* bias) {{
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0;
    if (nR == 0 && !proj) {{  /* no recurrent product: rows are independent, one pass each */
        #pragma omp parallel for schedule(static) if ((long)B * H * T >= L->par_min)
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t) {{
                const long s = (long)t * B + b;
                SFX(fwd_row)(L, Z + s * nbH, bias, L->memory ? C + s * H : 0, L->memory ? C + (s + B) * H : 0,
                             L->memory ? TC + s * H : 0, Hs + (s + B) * P);
            }}
        return 0;
    }}
#if CAN_PACK
    float* pw = nR ? la_pack(1, B, nR * H, P, w_hh, P) : 0;
#endif
    for (int t = 0; t < T; ++t) {{
        {real}* z = Z + (long)t * B * nbH;
        const {real}* hp = Hs + (long)t * B * P;
        if (nR) {{
            hp = SFX(dropped)(hp, hmask, hmask ? HM + (long)t * B * P : 0, (long)B * P);  /* h' */
            STEP_MM(pw, 1, B, nR * H, P, hp, P, w_hh, P, 1, z + L->r0 * H, nbH);
        }}
        {real}* hout = proj ? HH + (long)t * B * H : Hs + (long)(t + 1) * B * P;
        #pragma omp parallel for schedule(static) if ((long)B * H >= L->par_min)
        for (int b = 0; b < B; ++b)
            SFX(fwd_row)(L, z + (long)b * nbH, bias, L->memory ? C + ((long)t * B + b) * H : 0,
                         L->memory ? C + ((long)(t + 1) * B + b) * H : 0,
                         L->memory ? TC + ((long)t * B + b) * H : 0, hout + (long)b * (proj ? H : P));
        if (proj) SFX(gemm)(1, B, P, H, hout, H, w_hr, H, 0, Hs + (long)(t + 1) * B * P, P);
    }}
#if CAN_PACK
    free(pw);
#endif
    return 0;
}}

/* One row of one step of the backward element-wise work: dz of every block from dhh (the
   gradient w.r.t. o*tanh(c), or h without a memory cell) and the dc carried in (dcin); the dc
   carried to the previous step goes to carry.  Specialised like fwd_row. */
static inline __attribute__((always_inline)) void SFX(bwd_row_impl)(
        const int HAS_F, const int HAS_O, const int SRNN, const int H, const {real}* a, int fi, int oi,
        int nG, const {real}* cp, const {real}* tc, const {real}* dhh, const {real}* dcin, {real}* dz,
        {real}* carry) {{
    const {real}* ai = a;
    const {real}* af = a + (HAS_F ? fi : 0) * H;
    const {real}* ao = a + (HAS_O ? oi : 0) * H;
    const {real}* ag = a + nG * H;
    {real}* di = dz;
    {real}* df = dz + (HAS_F ? fi : 0) * H;
    {real}* dO = dz + (HAS_O ? oi : 0) * H;
    {real}* dg = dz + nG * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {{
        {real} i = ai[j], g = ag[j], t = tc[j], d = dhh[j];
        {real} o = HAS_O ? ao[j] : 1;
        {real} dc = dcin[j] + d * o * (1 - t * t);
        {real} f = HAS_F ? af[j] : 1;
        di[j] = dc * g * i * (1 - i);
        dg[j] = SRNN ? dc * i * (1 - g * g) : dc * i;
        if (HAS_F) df[j] = dc * cp[j] * f * (1 - f);
        if (HAS_O) dO[j] = d * t * o * (1 - o);
        carry[j] = dc * f;
    }}
}}

static void SFX(bwd_row)(const LAYOUT* L, const {real}* a, const {real}* cp, const {real}* tc,
                         const {real}* hh, const {real}* dhh, const {real}* dcin, {real}* dz, {real}* carry) {{
    const int H = L->H, fi = L->fi, oi = L->oi, nG = L->nG;
    if (!L->memory) {{
        #pragma omp simd
        for (int j = 0; j < H; ++j) dz[j] = dhh[j] * (1 - hh[j] * hh[j]);
        return;
    }}
    switch ((fi >= 0) * 4 + (oi >= 0) * 2 + (L->srnn != 0)) {{
        case 7: SFX(bwd_row_impl)(1, 1, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 6: SFX(bwd_row_impl)(1, 1, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 5: SFX(bwd_row_impl)(1, 0, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 4: SFX(bwd_row_impl)(1, 0, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 3: SFX(bwd_row_impl)(0, 1, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 2: SFX(bwd_row_impl)(0, 1, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 1: SFX(bwd_row_impl)(0, 0, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        default: SFX(bwd_row_impl)(0, 0, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
    }}
}}

/* Backward over T steps (reverse).  DH (T,B,P): gradient w.r.t. h_t from the outputs and the
   final state; the recurrent contributions are added in place, so on return DH[t] is the full
   gradient w.r.t. h_t.  DC (T,B,H): gradient w.r.t. c_t injected from the final state; on return
   the carry into each step.  dZ (T,B,nb*H) out; DHH (T,B,H) out if proj; dh0 (B,P), dc0 (B,H)
   out; tmp (B,P) scratch. */
int SFX(lstm_bwd)(const LAYOUT* L, int T, int B, const {real}* A, const {real}* C, const {real}* TC,
                  const {real}* Hs, {real}* DH, {real}* DC, {real}* dZ, {real}* DHH, {real}* dh0, {real}* dc0,
                  const {real}* w_hh, const {real}* w_hr, const {real}* hmask, {real}* tmp) {{
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0;
    if (nR == 0 && !proj) {{
        #pragma omp parallel for schedule(static) if ((long)B * H * T >= L->par_min)
        for (int b = 0; b < B; ++b)
            for (int t = T - 1; t >= 0; --t) {{
                const long s = (long)t * B + b;
                {real}* cr = tmp + (long)b * H;
                SFX(bwd_row)(L, A + s * nbH, C + s * H, TC + s * H, Hs + (s + B) * P, DH + s * P,
                             DC + s * H, dZ + s * nbH, cr);
                if (t > 0) {{ {real}* out = DC + (s - B) * H; for (int j = 0; j < H; ++j) out[j] += cr[j]; }}
                else {{ {real}* out = dc0 + (long)b * H; for (int j = 0; j < H; ++j) out[j] = cr[j]; }}
            }}
        for (long e = 0; e < (long)B * P; ++e) dh0[e] = 0;
        return 0;
    }}
#if CAN_PACK
    float* pw = nR ? la_pack(0, B, P, nR * H, w_hh, P) : 0;
#endif
    for (int t = T - 1; t >= 0; --t) {{
        {real}* dh = DH + (long)t * B * P;
        const {real}* dhh = dh;
        if (proj) {{
            SFX(gemm)(0, B, H, P, dh, P, w_hr, H, 0, DHH + (long)t * B * H, H);
            dhh = DHH + (long)t * B * H;
        }}
        {real}* dz = dZ + (long)t * B * nbH;
        {real}* carry = t > 0 ? DC + (long)(t - 1) * B * H : dc0;
        #pragma omp parallel for schedule(static) if ((long)B * H >= L->par_min)
        for (int b = 0; b < B; ++b) {{
            const long s = (long)t * B + b;
            {real}* cr = L->memory ? tmp + (long)b * H : 0;
            SFX(bwd_row)(L, A + s * nbH, L->memory ? C + s * H : 0, L->memory ? TC + s * H : 0,
                         Hs + (s + B) * P, dhh + (long)b * H, L->memory ? DC + s * H : 0,
                         dz + (long)b * nbH, cr);
            if (L->memory) {{
                {real}* out = carry + (long)b * H;
                if (t > 0) for (int j = 0; j < H; ++j) out[j] += cr[j];
                else for (int j = 0; j < H; ++j) out[j] = cr[j];
            }}
        }}
        {real}* target = t > 0 ? DH + (long)(t - 1) * B * P : dh0;
        if (nR) {{
            if (hmask) {{
                {real}* g = tmp + (long)B * H;
                STEP_MM(pw, 0, B, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, 0, g, P);
                SFX(add_masked)(target, g, hmask, (long)B * P, t > 0);
            }} else {{
                STEP_MM(pw, 0, B, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, t > 0 ? 1 : 0, target, P);
            }}
        }} else if (t == 0) {{
            for (long e = 0; e < (long)B * P; ++e) dh0[e] = 0;
        }}
    }}
#if CAN_PACK
    free(pw);
#endif
    return 0;
}}

/* ---- the GRU (Neubig eqs 56-59; reset_after: cuDNN's variant) ----------------------------
   Z (T,B,3H): x_t W_ih^T in (bias added here), r, z, n out; Hs (T+1,B,H) with Hs[0] = h0;
   U (T,B,H): r * h' (reset before) or W_hh,n h' + b_hh (reset after); HM (T,B,H): h' = h*mask;
   R (B,3H): scratch. */
int SFX(gru_fwd)(int T, int B, int H, int reset_after, {real}* Z, {real}* Hs, {real}* U, {real}* HM,
                 const {real}* w_hh, const {real}* bias, const {real}* b_hh, const {real}* hmask,
                 {real}* R, long par_min) {{
    const int H3 = 3 * H;
#if CAN_PACK
    float* p_rz = reset_after ? la_pack(1, B, H3, H, w_hh, H) : la_pack(1, B, 2 * H, H, w_hh, H);
    float* p_n = reset_after ? 0 : la_pack(1, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = 0; t < T; ++t) {{
        {real}* z = Z + (long)t * B * H3;
        const {real}* hp = Hs + (long)t * B * H;
        {real}* hn = Hs + (long)(t + 1) * B * H;
        {real}* u = U + (long)t * B * H;
        const {real}* hh = SFX(dropped)(hp, hmask, hmask ? HM + (long)t * B * H : 0, (long)B * H);  /* h' */
        if (reset_after) {{
            STEP_MM(p_rz, 1, B, H3, H, hh, H, w_hh, H, 0, R, H3);
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                {real}* zr = z + (long)b * H3; {real}* zz = zr + H; {real}* zn = zr + 2 * H;
                const {real}* rr = R + (long)b * H3;
                const {real}* hpb = hp + (long)b * H;
                {real}* ub = u + (long)b * H; {real}* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} r = SFX(sig)(zr[j] + bias[j] + rr[j]);
                    {real} zg = SFX(sig)(zz[j] + bias[H + j] + rr[H + j]);
                    {real} uu = rr[2 * H + j] + (b_hh ? b_hh[j] : 0);
                    {real} n = TANH(zn[j] + bias[2 * H + j] + r * uu);
                    zr[j] = r; zz[j] = zg; zn[j] = n; ub[j] = uu;
                    hb[j] = hpb[j] + zg * (n - hpb[j]);
                }}
            }}
        }} else {{
            STEP_MM(p_rz, 1, B, 2 * H, H, hh, H, w_hh, H, 1, z, H3);
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                {real}* zr = z + (long)b * H3; {real}* zz = zr + H;
                const {real}* hhb = hh + (long)b * H;
                {real}* ub = u + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} r = SFX(sig)(zr[j] + bias[j]);
                    zr[j] = r;
                    zz[j] = SFX(sig)(zz[j] + bias[H + j]);
                    ub[j] = r * hhb[j];
                }}
            }}
            STEP_MM(p_n, 1, B, H, H, u, H, w_hh + (long)2 * H * H, H, 1, z + 2 * H, H3);
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                {real}* zz = z + (long)b * H3 + H; {real}* zn = zz + H;
                const {real}* hpb = hp + (long)b * H;
                {real}* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} n = TANH(zn[j] + bias[2 * H + j]);
                    zn[j] = n;
                    hb[j] = hpb[j] + zz[j] * (n - hpb[j]);
                }}
            }}
        }}
    }}
#if CAN_PACK
    free(p_rz); free(p_n);
#endif
    return 0;
}}

/* Backward.  DH (T,B,H): gradient w.r.t. h_t from outputs / final state, recurrent parts added
   in place; G (T,B,3H) out: gradients of the recurrent products' outputs (d a_r, d a_z, and
   d a_n (reset before) or d a_n * r (reset after)); dZn (T,B,H) out: d a_n; dh0 (B,H) out;
   S (B,H) scratch. */
int SFX(gru_bwd)(int T, int B, int H, int reset_after, const {real}* A, const {real}* Hs,
                 const {real}* U, const {real}* HM, {real}* DH, {real}* G, {real}* dZn, {real}* dh0,
                 const {real}* w_hh, const {real}* hmask, {real}* S, long par_min) {{
    const int H3 = 3 * H;
#if CAN_PACK
    float* p_all = reset_after ? la_pack(0, B, H, H3, w_hh, H) : la_pack(0, B, H, 2 * H, w_hh, H);
    float* p_n = reset_after ? 0 : la_pack(0, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = T - 1; t >= 0; --t) {{
        const {real}* a = A + (long)t * B * H3;
        const {real}* hp = Hs + (long)t * B * H;
        const {real}* hh = HM ? HM + (long)t * B * H : hp;
        const {real}* u = U + (long)t * B * H;
        const {real}* dh = DH + (long)t * B * H;
        {real}* g = G + (long)t * B * H3;
        {real}* dn_out = dZn + (long)t * B * H;
        {real}* target = t > 0 ? DH + (long)(t - 1) * B * H : dh0;
        {real}* dhh = S;  /* gradient w.r.t. h' from the recurrent products */
        if (reset_after) {{
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                const {real}* ar = a + (long)b * H3; const {real}* az = ar + H; const {real}* an = ar + 2 * H;
                const {real}* hpb = hp + (long)b * H; const {real}* ub = u + (long)b * H;
                const {real}* dhb = dh + (long)b * H;
                {real}* gr = g + (long)b * H3; {real}* gz = gr + H; {real}* gn = gr + 2 * H;
                {real}* dnb = dn_out + (long)b * H; {real}* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} r = ar[j], zg = az[j], n = an[j], d = dhb[j];
                    {real} dan = d * zg * (1 - n * n);
                    dnb[j] = dan;
                    gz[j] = d * (n - hpb[j]) * zg * (1 - zg);
                    gr[j] = dan * ub[j] * r * (1 - r);
                    gn[j] = dan * r;
                    {real} keep = d * (1 - zg);
                    tb[j] = first ? keep : tb[j] + keep;
                }}
            }}
            STEP_MM(p_all, 0, B, H, H3, g, H3, w_hh, H, 0, dhh, H);
        }} else {{
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                const {real}* az = a + (long)b * H3 + H; const {real}* an = az + H;
                const {real}* hpb = hp + (long)b * H; const {real}* dhb = dh + (long)b * H;
                {real}* gz = g + (long)b * H3 + H; {real}* gn = gz + H;
                {real}* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} zg = az[j], n = an[j], d = dhb[j];
                    gn[j] = d * zg * (1 - n * n);
                    gz[j] = d * (n - hpb[j]) * zg * (1 - zg);
                    {real} keep = d * (1 - zg);
                    tb[j] = first ? keep : tb[j] + keep;
                }}
            }}
            /* du = d a_n W_n  (d of r * h') */
            STEP_MM(p_n, 0, B, H, H, g + 2 * H, H3, w_hh + (long)2 * H * H, H, 0, dhh, H);
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {{
                const {real}* ar = a + (long)b * H3; const {real}* hhb = hh + (long)b * H;
                const {real}* gnb = g + (long)b * H3 + 2 * H;
                {real}* gr = g + (long)b * H3; {real}* db = dhh + (long)b * H;
                {real}* dnb = dn_out + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {{
                    {real} r = ar[j], du = db[j];
                    gr[j] = du * hhb[j] * r * (1 - r);
                    db[j] = du * r;
                    dnb[j] = gnb[j];
                }}
            }}
            STEP_MM(p_all, 0, B, H, 2 * H, g, H3, w_hh, H, 1, dhh, H);
        }}
        if (hmask) SFX(add_masked)(target, dhh, hmask, (long)B * H, 1);
        else for (long e = 0; e < (long)B * H; ++e) target[e] += dhh[e];
    }}
#if CAN_PACK
    free(p_all); free(p_n);
#endif
    return 0;
}}
"""


class _LayoutC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("H", "P", "nb", "nG", "fi", "oi", "r0", "r1", "srnn",
                                           "memory", "nbias")] + [("par_min", ctypes.c_long)]


#: element-wise work (elements per step) above which a step's rows are split across threads
PAR_MIN = 1 << 10

_native_state: dict = {}


def _c_source() -> str:
    # the second-order cells' loops (imported here: that module imports this one)
    from .fused_multiplicative import _C_SECOND_ORDER

    parts = [_C_HEADER.format(version=_NATIVE_VERSION)]
    for real, sfx, exp, tanh, gemm, pack in (("float", "f", "la_expf", "la_tanhf", "SGEMM_PTR", 1),
                                             ("double", "d", "exp", "tanh", "DGEMM_PTR", 0)):
        parts.append(f"#define SFX(n) n##_{sfx}\n#define EXP {exp}\n#define TANH {tanh}\n"
                     f"#define GEMM {gemm}\n#define CAN_PACK {pack}\n")
        parts.append(_C_BODY.format(real=real))
        parts.append(_C_SECOND_ORDER.format(real=real))  # mrnn, mlstm, mmrnn, mmlstm
        parts.append("#undef SFX\n#undef EXP\n#undef TANH\n#undef GEMM\n#undef CAN_PACK\n#undef STEP_MM\n")
    return "\n".join(parts)


def _blas_pointers() -> tuple | None:
    """Addresses of sgemm_, dgemm_ and MKL's packed-GEMM functions (or None) in the BLAS
    PyTorch is linked with; None if sgemm_/dgemm_ are not exported."""
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "libtorch.so"):
        path = os.path.join(libdir, name)
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            gemm = tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in ("sgemm_", "dgemm_"))
        except (OSError, AttributeError):
            continue
        try:
            packed = tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in (
                "cblas_sgemm_pack_get_size", "cblas_sgemm_pack", "cblas_sgemm_compute"))
        except AttributeError:
            packed = (None, None, None)  # not MKL: plain sgemm_ per step
        return gemm + packed
    return None


def _cache_dir() -> str:
    d = os.environ.get("LSTMABLATE_KERNEL_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "lstmablate", "kernels")
    return d


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build_native() -> ctypes.CDLL:
    """Compile (or load from the cache) the native kernel; raises on any failure."""
    blas = _blas_pointers()
    if blas is None or not all(blas[:2]):
        raise RuntimeError("PyTorch's BLAS (sgemm_/dgemm_) is not exported by libtorch_cpu")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (set CC)")
    src = _c_source()
    flag_sets = [["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3", "-fopenmp-simd"],
                 ["-O3"]]
    if platform.machine().lower() in ("x86_64", "amd64"):  # 16 floats a vector where AVX-512 exists
        flag_sets.insert(0, ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"])
    base_flags = ["-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-std=c99"]
    key = hashlib.sha256("\0".join([src, cc, _cpu_signature(), torch.__version__,
                                    sys.platform]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:  # e.g. a read-only home: a private directory under the temp dir
        cache = os.path.join(tempfile.gettempdir(), f"lstmablate-kernels-{os.getuid()}"
                             if hasattr(os, "getuid") else "lstmablate-kernels")
        os.makedirs(cache, exist_ok=True)
    so = os.path.join(cache, f"lstmablate_fused_{key}.so")
    if not os.path.exists(so):
        errors = []
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            c_path = os.path.join(tmp, "fused.c")
            with open(c_path, "w") as fh:
                fh.write(src)
            out = os.path.join(tmp, "fused.so")
            for flags in flag_sets:
                proc = subprocess.run([cc, *flags, *base_flags, c_path, "-o", out, "-lm"],
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode == 0:
                    os.replace(out, so)  # atomic: concurrent builders do not collide
                    break
                errors.append(proc.stderr.strip()[-500:])
            else:
                raise RuntimeError(f"{cc} failed: {errors[-1]}")
    lib = ctypes.CDLL(so)
    lib.la_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.la_init.restype = ctypes.c_int
    if lib.la_init(*blas[:2]) != _NATIVE_VERSION:
        raise RuntimeError(f"stale kernel in {so}")
    lib.la_init_packed.argtypes = [ctypes.c_void_p] * 3
    if all(blas[2:]) and os.environ.get("LSTMABLATE_PACKED_GEMM", "1") != "0":
        lib.la_init_packed(*blas[2:])
    ptr = ctypes.c_void_p
    for sfx in ("f", "d"):
        fwd = getattr(lib, f"lstm_fwd_{sfx}")
        fwd.argtypes = [ctypes.POINTER(_LayoutC), ctypes.c_int, ctypes.c_int] + [ptr] * 10
        fwd.restype = ctypes.c_int
        bwd = getattr(lib, f"lstm_bwd_{sfx}")
        bwd.argtypes = [ctypes.POINTER(_LayoutC), ctypes.c_int, ctypes.c_int] + [ptr] * 14
        bwd.restype = ctypes.c_int
        gf = getattr(lib, f"gru_fwd_{sfx}")
        gf.argtypes = [ctypes.c_int] * 4 + [ptr] * 9 + [ctypes.c_long]
        gf.restype = ctypes.c_int
        gb = getattr(lib, f"gru_bwd_{sfx}")
        gb.argtypes = [ctypes.c_int] * 4 + [ptr] * 11 + [ctypes.c_long]
        gb.restype = ctypes.c_int
        ff = getattr(lib, f"factored_fwd_{sfx}")  # mrnn / mlstm: see fused_multiplicative
        ff.argtypes = [ctypes.c_int] * 5 + [ctypes.c_long] + [ptr] * 11
        ff.restype = ctypes.c_int
        fb = getattr(lib, f"factored_bwd_{sfx}")
        fb.argtypes = [ctypes.c_int] * 5 + [ctypes.c_long] + [ptr] * 16
        fb.restype = ctypes.c_int
        mf = getattr(lib, f"multi_fwd_{sfx}")  # mmrnn / mmlstm
        mf.argtypes = [ctypes.c_int, ctypes.c_int, ptr] + [ctypes.c_int] * 3 + [ctypes.c_long] + [ptr] * 11
        mf.restype = ctypes.c_int
        mb = getattr(lib, f"multi_bwd_{sfx}")
        mb.argtypes = [ctypes.c_int, ctypes.c_int, ptr] + [ctypes.c_int] * 3 + [ctypes.c_long] + [ptr] * 19
        mb.restype = ctypes.c_int
    return lib


def native_enabled() -> bool:
    """Whether the native kernel may be used (``LSTMABLATE_NATIVE=0`` turns it off)."""
    return os.environ.get("LSTMABLATE_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def native_kernel() -> ctypes.CDLL | None:
    """The compiled native kernel, building it on first use; None (after one warning) if it
    cannot be built here."""
    if not native_enabled():
        return None
    if "lib" not in _native_state:
        try:
            _native_state["lib"] = _build_native()
        except Exception as err:  # noqa: BLE001  (any failure: fall back, once, loudly)
            _native_state["lib"] = None
            warnings.warn(f"lstmablate: the native LSTM kernel is not available ({err}); using the "
                          "PyTorch kernels, which are slower for small hidden sizes. Set "
                          "LSTMABLATE_NATIVE=0 to silence this.", RuntimeWarning, stacklevel=3)
    return _native_state["lib"]


def native_kernel_for(device_type: str, dtype: torch.dtype) -> ctypes.CDLL | None:
    """The native kernel if it runs calls on this device and dtype (CPU, float32/float64, and
    it builds here), else None."""
    if device_type != "cpu" or dtype not in (torch.float32, torch.float64):
        return None
    return native_kernel()


def _native_for(x: Tensor) -> ctypes.CDLL | None:
    """:func:`native_kernel_for` this call's input."""
    return native_kernel_for(x.device.type, x.dtype)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _c_layout(L: "_Layout", nbias: int = 0) -> _LayoutC:
    return _LayoutC(L.H, L.P, L.nb, L.nG, L.fi, L.oi, L.r0, L.r1, int(L.srnn), int(L.memory),
                    nbias, PAR_MIN)


# ---------------------------------------------------------------------------------
# the recurrent kernel (LSTM family, gates and/or content read h_{t-1})
# ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    H: int  # hidden size
    P: int  # output size (proj_size or H)
    nb: int  # number of blocks (gates + content)
    nG: int  # number of gates (i, f, o as present)
    fi: int  # block index of f, -1 if none
    oi: int  # block index of o, -1 if none
    r0: int  # recurrent blocks are the contiguous range [r0, r1)
    r1: int
    srnn: bool  # content = tanh(...) (else linear)
    memory: bool  # False: eq 1, h = tanh(z)


def _layout(cell) -> _Layout:
    b = cell.blocks
    rec = [b.index(r) for r in cell.recurrent_blocks]
    r0, r1 = (min(rec), max(rec) + 1) if rec else (0, 0)
    assert rec == list(range(r0, r1)), "recurrent blocks must be contiguous"
    return _Layout(H=cell.hidden_size, P=cell.output_size, nb=len(b), nG=len(b) - 1,
                   fi=b.index("f") if "f" in b else -1, oi=b.index("o") if "o" in b else -1,
                   r0=r0, r1=r1, srnn=cell.content == "srnn", memory=cell.memory_cell)


def _recurrent(cell, x, state, lengths, h_mask):
    L = _layout(cell)
    h0 = state[0]
    c0 = state[1] if L.memory else None
    out, hn, cn = _RecurrentLSTM.apply(L, x, h0, c0, cell.weight_ih, cell.weight_hh, cell.bias,
                                       cell.weight_hr, h_mask, lengths)
    return out, ((hn, cn) if L.memory else (hn,))


class _RecurrentLSTM(torch.autograd.Function):
    """The LSTM-family recurrence with a hand-written BPTT (see the module docstring).

    Buffers (allocated once per call; the loops only write into per-step views
    of them, made up front with ``unbind``):

    * ``Z`` (T, B, nb*H): pre-activations x_t W_ih^T + b, then h_{t-1} W_hh^T
      added in place for the recurrent blocks, then the activations in place;
    * ``Hs`` (T+1, B, P): h_{-1} = h_0, h_0, ..., h_{T-1}; ``C`` (T+1, B, H) likewise;
    * ``TC`` (T, B, H): tanh(c_t); ``HH`` (T, B, H): o_t * tanh(c_t) before a projection;
    * ``HM`` (T, B, P): h_{t-1} * h_mask (what the recurrent product read), with recurrent dropout.
    """

    @staticmethod
    def forward(ctx, L: _Layout, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths):
        T, B, _ = x.shape
        H, P = L.H, L.P
        rs = slice(L.r0 * H, L.r1 * H)
        Hs = x.new_empty(T + 1, B, P)
        Hs[0] = h0
        lib = _native_for(x)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, w_hr, h_mask, h0, c0)):
            ctx.native = lib
            Z = _input_products(x, w_ih, None)  # the kernel adds the bias
            return _RecurrentLSTM._forward_native(ctx, lib, L, x, h0, c0, w_ih, w_hh, bias, w_hr,
                                                  h_mask, lengths, Z, Hs)
        ctx.native = None
        Z = _input_products(x, w_ih, bias)  # (T, B, nb*H): pre-activations, then activations
        hs = Hs.unbind(0)
        HM = x.new_empty(T, B, P) if h_mask is not None else None
        hms = HM.unbind(0) if HM is not None else None
        w_hh_t = w_hh.t() if w_hh is not None else None
        zr = Z[:, :, rs].unbind(0)
        C = TC = HH = None
        if not L.memory:  # eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b)
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                z = zr[t]
                z.addmm_(hp, w_hh_t)
                torch.tanh(z, out=hs[t + 1])
        else:
            C = x.new_empty(T + 1, B, H)
            C[0] = c0
            cs = C.unbind(0)
            proj = w_hr is not None
            has_o = L.oi >= 0
            TC = Hs[1:] if (not has_o and not proj) else x.new_empty(T, B, H)  # tanh(c_t)
            tcs = TC.unbind(0)
            HH = x.new_empty(T, B, H) if proj else None
            hhs = HH.unbind(0) if proj else hs[1:]
            Z4 = Z.view(T, B, L.nb, H)
            zi = Z4[:, :, 0].unbind(0)
            zf = Z4[:, :, L.fi].unbind(0) if L.fi >= 0 else None
            zo = Z4[:, :, L.oi].unbind(0) if has_o else None
            zc = Z4[:, :, L.nG].unbind(0)
            rec_gates = L.r0 < L.nG  # the gates read h: they are activated step by step
            rec_content = L.r1 == L.nb
            zg = Z[:, :, :L.nG * H].unbind(0) if rec_gates else None
            if not rec_gates:
                Z4[:, :, :L.nG].sigmoid_()
            if L.srnn and not rec_content:
                Z4[:, :, L.nG].tanh_()
            tanh_content = L.srnn and rec_content
            w_hr_t = w_hr.t() if proj else None
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                zr[t].addmm_(hp, w_hh_t)
                if rec_gates:
                    zg[t].sigmoid_()
                if tanh_content:
                    zc[t].tanh_()
                c = cs[t + 1]
                if zf is not None:
                    torch.mul(zf[t], cs[t], out=c)
                    c.addcmul_(zi[t], zc[t])
                else:
                    torch.addcmul(cs[t], zi[t], zc[t], out=c)
                tc = torch.tanh(c, out=tcs[t])
                if has_o:
                    torch.mul(zo[t], tc, out=hhs[t])
                elif proj:
                    hhs[t].copy_(tc)
                if proj:
                    torch.mm(hhs[t], w_hr_t, out=hs[t + 1])
        out, hn, cn = _outputs(Hs, C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, w_hh, bias, w_hr, h_mask, lengths, Z, Hs, HM, C, TC, HH)
        return out, hn, cn

    @staticmethod
    def _forward_native(ctx, lib, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths, Z, Hs):
        T, B, _ = x.shape
        H, P = L.H, L.P
        HM = x.new_empty(T, B, P) if h_mask is not None and w_hh is not None else None
        C = TC = HH = None
        if L.memory:
            C = x.new_empty(T + 1, B, H)
            C[0] = c0
            TC = x.new_empty(T, B, H)
            HH = x.new_empty(T, B, H) if w_hr is not None else None
        w_hh = w_hh.contiguous() if w_hh is not None else None
        w_hr = w_hr.contiguous() if w_hr is not None else None
        hm = h_mask.contiguous() if HM is not None else None
        b = bias.contiguous() if bias is not None else None
        fn = lib.lstm_fwd_f if x.dtype == torch.float32 else lib.lstm_fwd_d
        fn(ctypes.byref(_c_layout(L, b.shape[0] if b is not None else 0)), T, B, _ptr(Z), _ptr(Hs),
           _ptr(C), _ptr(TC), _ptr(HH), _ptr(HM), _ptr(w_hh), _ptr(w_hr), _ptr(hm), _ptr(b))
        out, hn, cn = _outputs(Hs, C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, w_hh, bias, w_hr, hm, lengths, Z, Hs, HM, C, TC, HH)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: _Layout = ctx.L
        x, w_ih, w_hh, bias, w_hr, h_mask, lengths, A, Hs, HM, C, TC, HH = ctx.saved_tensors
        T, B, _ = x.shape
        H, P, nb = L.H, L.P, L.nb
        rs = slice(L.r0 * H, L.r1 * H)
        # DH[t]: gradient w.r.t. h_t (outputs and the final state folded in; the
        # recurrent contributions are added by the loop)
        DH, dh0_direct = _state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        if ctx.native is not None:
            dZ = A.new_empty(T, B, nb * H)
            DCx, dc0_direct = (_state_grads_into_steps(None, dcn, lengths, C[1:]) if L.memory
                               else (None, None))
            DHH = A.new_empty(T, B, H) if w_hr is not None else None
            dh0 = A.new_empty(B, P)
            dc0 = A.new_empty(B, H) if L.memory else None
            tmp = A.new_empty(B * H + B * P)
            fn = ctx.native.lstm_bwd_f if A.dtype == torch.float32 else ctx.native.lstm_bwd_d
            fn(ctypes.byref(_c_layout(L)), T, B, _ptr(A), _ptr(C), _ptr(TC), _ptr(Hs), _ptr(DH),
               _ptr(DCx), _ptr(dZ), _ptr(DHH), _ptr(dh0), _ptr(dc0), _ptr(w_hh), _ptr(w_hr),
               _ptr(h_mask), _ptr(tmp))
            dh0 = _add(dh0, dh0_direct)
            dc0 = _add(dc0, dc0_direct)
            return _RecurrentLSTM._weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH,
                                                dZ, dh0, dc0)
        dhs = DH.unbind(0)
        dZ = A.new_empty(T, B, nb * H)
        dzr = dZ[:, :, rs].unbind(0)
        if not L.memory:
            K = Hs[1:] * Hs[1:]
            K.neg_().add_(1)  # tanh' = 1 - h^2
            ks = K.unbind(0)
            for t in range(T - 1, -1, -1):
                torch.mul(dhs[t], ks[t], out=dzr[t])
                if t > 0:
                    if h_mask is None:
                        dhs[t - 1].addmm_(dzr[t], w_hh)
                    else:
                        dhs[t - 1].addcmul_(torch.mm(dzr[t], w_hh), h_mask)
            dh0 = torch.mm(dzr[0], w_hh)
            if h_mask is not None:
                dh0.mul_(h_mask)
            dc0 = None
        else:
            proj = w_hr is not None
            # dc injected per step (the final state's gradient), then the carry from t+1
            DCx, dc0_direct = _state_grads_into_steps(None, dcn, lengths, C[1:])
            dcxs = DCx.unbind(0)
            tc = TC
            A4 = A.view(T, B, nb, H)
            G = A4[:, :, :L.nG]  # gate activations
            g = A4[:, :, L.nG]
            # derivative factors of all steps at once:
            #   dz_k = dc * K_k (k = i, f, g),  dz_o = dhh * K_o,  dc = carry + dhh * Kc
            K = A.new_empty(T, B, nb, H)
            sd = G * (1 - G)  # sigmoid' of every gate
            torch.mul(sd[:, :, 0], g, out=K[:, :, 0])  # i
            if L.fi >= 0:
                torch.mul(sd[:, :, L.fi], C[:-1], out=K[:, :, L.fi])
            if L.oi >= 0:
                torch.mul(sd[:, :, L.oi], tc, out=K[:, :, L.oi])
            if L.srnn:
                torch.mul(1 - g * g, G[:, :, 0], out=K[:, :, L.nG])
            else:
                K[:, :, L.nG] = G[:, :, 0]
            Kc = 1 - tc * tc
            if L.oi >= 0:
                Kc.mul_(A4[:, :, L.oi])
            kcs = Kc.unbind(0)
            dZ4 = dZ.view(T, B, nb, H)
            DC = A.new_empty(T, B, H)
            dcs = DC.unbind(0)
            DHH = A.new_empty(T, B, H) if proj else DH
            dhhs = DHH.unbind(0)
            r0, r1, oi = L.r0, L.r1, L.oi
            has_rec = r1 > r0
            o_rec = r0 <= oi < r1
            krec = K[:, :, r0:r1].unbind(0)
            dz4rec = dZ4[:, :, r0:r1].unbind(0)
            ko = K[:, :, oi].unbind(0) if o_rec else None
            dzo = dZ4[:, :, oi].unbind(0) if o_rec else None
            fs = A4[:, :, L.fi].unbind(0) if L.fi >= 0 else None
            for t in range(T - 1, -1, -1):
                dhh = torch.mm(dhs[t], w_hr, out=dhhs[t]) if proj else dhs[t]
                dc = torch.addcmul(dcxs[t], dhh, kcs[t], out=dcs[t])
                if has_rec:
                    torch.mul(krec[t], dc.unsqueeze(1), out=dz4rec[t])
                    if o_rec:
                        torch.mul(ko[t], dhh, out=dzo[t])
                if t > 0:
                    if has_rec:
                        if h_mask is None:
                            dhs[t - 1].addmm_(dzr[t], w_hh)
                        else:
                            dhs[t - 1].addcmul_(torch.mm(dzr[t], w_hh), h_mask)
                    if fs is not None:
                        dcxs[t - 1].addcmul_(dc, fs[t])
                    else:
                        dcxs[t - 1].add_(dc)
            # the blocks that do not read h: all steps at once
            for k in range(nb):
                if r0 <= k < r1:
                    continue
                torch.mul(K[:, :, k], DHH if k == oi else DC, out=dZ4[:, :, k])
            if has_rec:
                dh0 = torch.mm(dzr[0], w_hh)
                if h_mask is not None:
                    dh0.mul_(h_mask)
            else:
                dh0 = None
            dc0 = dcs[0] * fs[0] if fs is not None else dcs[0].clone()
            dc0 = _add(dc0, dc0_direct)
        dh0 = _add(dh0, dh0_direct)
        if dh0 is None:
            dh0 = torch.zeros_like(Hs[0])
        return _RecurrentLSTM._weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH, dZ,
                                            dh0, dc0)

    @staticmethod
    def _weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH, dZ, dh0, dc0):
        """Input and weight gradients: one matrix product each, over all steps."""
        T, B, _ = x.shape
        H, P, nb = L.H, L.P, L.nb
        rs = slice(L.r0 * H, L.r1 * H)
        need = ctx.needs_input_grad
        Hprev = Hs[:-1] if HM is None else HM  # what the recurrent product read
        dZ2 = dZ.view(T * B, nb * H)
        dx = torch.mm(dZ2, w_ih).view(x.shape) if need[1] else None
        dw_ih = torch.mm(dZ2.t(), x.reshape(T * B, -1)) if need[4] else None
        dw_hh = None
        if w_hh is not None and need[5]:
            dw_hh = torch.mm(dZ2[:, rs].t(), Hprev.reshape(T * B, P))
        db = dZ2[:, :bias.shape[0]].sum(0) if bias is not None and need[6] else None
        dw_hr = None
        if w_hr is not None and need[7]:
            dw_hr = torch.mm(DH.reshape(T * B, P).t(), HH.reshape(T * B, H))
        return (None, dx, dh0 if need[2] else None, dc0 if L.memory and need[3] else None,
                dw_ih, dw_hh, db, dw_hr, None, None)


# ---------------------------------------------------------------------------------
# the scan kernel (LSTM family, nothing reads h_{t-1})
# ---------------------------------------------------------------------------------

def _scan(cell, x, state, lengths):
    L = _layout(cell)
    if _native_for(x) is not None:  # the native loop has no recurrent product to do here
        return _recurrent(cell, x, state, lengths, None)
    out, hn, cn = _ScanLSTM.apply(L, x, state[0], state[1], cell.weight_ih, cell.bias,
                                  cell.weight_hr, lengths)
    return out, (hn, cn)


class _ScanLSTM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, L: _Layout, x, h0, c0, w_ih, bias, w_hr, lengths):
        T, B, _ = x.shape
        H = L.H
        A = _input_products(x, w_ih, bias)
        A4 = A.view(T, B, L.nb, H)
        A4[:, :, :L.nG].sigmoid_()
        if L.srnn:
            A4[:, :, L.nG].tanh_()
        i, g = A4[:, :, 0], A4[:, :, L.nG]
        C = x.new_empty(T + 1, B, H)
        C[0] = c0
        U = i * g  # what is written at each step
        if L.fi >= 0:
            f = A4[:, :, L.fi]
            for t in range(T):  # c_t = f_t * c_{t-1} + u_t
                torch.addcmul(U[t], f[t], C[t], out=C[t + 1])
        else:  # no forget gate: c_t = c_0 + sum_{k<=t} u_k
            torch.cumsum(U, 0, out=C[1:])
            C[1:] += c0
        TC = torch.tanh(C[1:])
        HH = TC * A4[:, :, L.oi] if L.oi >= 0 else TC  # o_t * tanh(c_t)
        Hn = HH if w_hr is None else torch.matmul(HH, w_hr.t())  # the projection, all steps at once
        out = _masked_outputs(Hn, lengths)
        if lengths is None:
            hn = Hn[-1].clone()
        else:
            hn = torch.cat([h0.unsqueeze(0), Hn])[lengths, torch.arange(B, device=x.device)]
        cn = _final(C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, bias, w_hr, lengths, A, C, TC, HH if w_hr is not None else None)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: _Layout = ctx.L
        x, w_ih, bias, w_hr, lengths, A, C, TC, HH = ctx.saved_tensors
        T, B, _ = x.shape
        H, nb = L.H, L.nb
        need = ctx.needs_input_grad  # (L, x, h0, c0, w_ih, bias, w_hr, lengths)
        A4 = A.view(T, B, nb, H)
        DH, dh0 = _state_grads_into_steps(dout, dhn, lengths, TC if w_hr is None else
                                          TC.new_empty(T, B, L.P))
        dw_hr = None
        if w_hr is not None:
            if need[6]:
                dw_hr = torch.mm(DH.reshape(T * B, L.P).t(), HH.reshape(T * B, H))
            DH = torch.matmul(DH, w_hr)
        DC, dc0_direct = _state_grads_into_steps(None, dcn, lengths, TC)
        dZ = A.new_empty(T, B, nb, H)
        if L.oi >= 0:
            o = A4[:, :, L.oi]
            torch.mul(DH, TC, out=dZ[:, :, L.oi])  # d o
            DH = DH * o
        DC.addcmul_(DH, 1 - TC * TC)  # + dh * tanh'(c)
        # reverse scan: dc_{t-1} += f_t * dc_t
        if L.fi >= 0:
            f = A4[:, :, L.fi]
            for t in range(T - 1, 0, -1):
                DC[t - 1].addcmul_(DC[t], f[t])
            dc0 = DC[0] * f[0]
            torch.mul(DC, C[:-1], out=dZ[:, :, L.fi])  # d f
        else:
            DC = DC.flip(0).cumsum(0).flip(0)
            dc0 = DC[0].clone()
        dc0 = _add(dc0, dc0_direct)
        i, g = A4[:, :, 0], A4[:, :, L.nG]
        torch.mul(DC, g, out=dZ[:, :, 0])  # d i
        torch.mul(DC, i, out=dZ[:, :, L.nG])  # d g
        G = A4[:, :, :L.nG]
        dZ[:, :, :L.nG].mul_(G * (1 - G))  # sigmoid'
        if L.srnn:
            dZ[:, :, L.nG].mul_(1 - g * g)
        dZ2 = dZ.view(T * B, nb * H)
        dx = torch.mm(dZ2, w_ih).view(x.shape) if need[1] else None
        dw_ih = torch.mm(dZ2.t(), x.reshape(T * B, -1)) if need[4] else None
        db = dZ2[:, :bias.shape[0]].sum(0) if bias is not None and need[5] else None
        if need[2] and dh0 is None and lengths is not None:  # h_0 is read only as a carried state
            dh0 = dc0.new_zeros(B, L.P)
        return (None, dx, dh0 if need[2] else None, dc0 if need[3] else None, dw_ih, db, dw_hr,
                None)


# ---------------------------------------------------------------------------------
# the GRU (eqs 56-59 of the Neubig notes; reset_after: cuDNN's variant)
# ---------------------------------------------------------------------------------

def gru_plan(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
             mask: str = "none", h_mask: bool = False, autocast: bool = False,
             reference: bool | None = None) -> str:
    """``torch-gru`` (cuDNN, ``reset_after`` on CUDA), ``recurrent`` or ``reference``."""
    if reference is None:
        reference = reference_forced()
    if reference or autocast or mask == "other" or not dtype.is_floating_point:
        return "reference"
    if dtype not in (torch.float32, torch.float64) and device_type == "cpu":
        return "reference"
    if device_type == "cuda" and cell.reset_after and not h_mask and mask != "prefix0":
        return "torch-gru"
    return "recurrent"


def gru_fast_path_available(cell) -> bool:
    return gru_plan(cell, reference=False) != "reference"


def gru_forward(cell, x: Tensor, state: State | None, mask: Tensor | None,
                h_mask: Tensor | None) -> tuple[Tensor, State] | None:
    """The fast path of :class:`~lstmablate.cells.gru.GRUCell`, or None (reference loop)."""
    if reference_forced() or x.dim() != 3:
        return None
    kind, lengths = mask_kind(mask)
    autocast = _autocast_on(x)
    path = gru_plan(cell, device_type=x.device.type, dtype=x.dtype, mask=kind,
                    h_mask=h_mask is not None, autocast=autocast)
    if path == "reference":
        return None
    T, B = x.shape[0], x.shape[1]
    h0 = cell.initial_state(B, x)[0] if state is None else state[0]
    if T == 0:
        return x.new_zeros(0, B, cell.hidden_size), (h0,)
    if path == "torch-gru":
        H = cell.hidden_size

        def neg_z(w: Tensor) -> Tensor:  # torch's update gate is 1 - ours: sigma(-a) = 1 - sigma(a)
            return torch.cat([w[:H], -w[H:2 * H], w[2 * H:]])

        b_hh = torch.cat([cell.bias_hh.new_zeros(2 * H), cell.bias_hh])
        weights = [neg_z(cell.weight_ih), neg_z(cell.weight_hh), neg_z(cell.bias), b_hh]
        quiet = _cuda_quiet(x)
        try:
            out, hn = _run_vf(torch._VF.gru, x, h0.unsqueeze(0), weights, True, lengths)
        finally:
            if quiet is not None:
                quiet.__exit__(None, None, None)
        return out, (hn[0],)
    out, hn = _RecurrentGRU.apply(cell.reset_after, x, h0, cell.weight_ih, cell.weight_hh, cell.bias,
                                  cell.bias_hh, h_mask, lengths)
    return out, (hn,)


class _RecurrentGRU(torch.autograd.Function):
    """The GRU recurrence with a hand-written BPTT (PyTorch loops; runs on any device).

    Forward buffers: ``A`` (T, B, 3H) pre-activations, then r, z, n in place; ``Hs``
    (T+1, B, H) with Hs[0] = h0; ``U`` (T, B, H): r * h_{t-1}' (eq 58, the input of
    W_hh's candidate block), or with ``reset_after`` W_hh,n h_{t-1}' + b_hh; ``HM``:
    h_{t-1}' = h_{t-1} * h_mask with recurrent dropout.
    """

    @staticmethod
    def forward(ctx, reset_after, x, h0, w_ih, w_hh, bias, bias_hh, h_mask, lengths):
        T, B, _ = x.shape
        H = h0.shape[-1]
        lib = _native_for(x)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, bias_hh, h_mask, h0)):
            ctx.native = lib
            A = _input_products(x, w_ih, None)  # the kernel adds the biases
            Hs = x.new_empty(T + 1, B, H)
            Hs[0] = h0
            U = x.new_empty(T, B, H)
            HM = x.new_empty(T, B, H) if h_mask is not None else None
            hm = h_mask.contiguous() if h_mask is not None else None
            w_hh = w_hh.contiguous()
            b = bias.contiguous()
            bhh = bias_hh.contiguous() if (reset_after and bias_hh is not None) else None
            scratch = x.new_empty(B, 3 * H)  # (kept referenced until the call returns)
            fn = lib.gru_fwd_f if x.dtype == torch.float32 else lib.gru_fwd_d
            fn(T, B, H, int(bool(reset_after)), _ptr(A), _ptr(Hs), _ptr(U), _ptr(HM), _ptr(w_hh),
               _ptr(b), _ptr(bhh), _ptr(hm), _ptr(scratch), PAR_MIN)
            out = _masked_outputs(Hs[1:], lengths)
            hn = _final(Hs, lengths)
            ctx.reset_after = reset_after
            ctx.save_for_backward(x, w_ih, w_hh, bias, bias_hh, hm, lengths, A, Hs, HM, U)
            return out, hn
        ctx.native = None
        A = _input_products(x, w_ih, bias)  # (T, B, 3H)
        Hs = x.new_empty(T + 1, B, H)
        Hs[0] = h0
        hs = Hs.unbind(0)
        HM = x.new_empty(T, B, H) if h_mask is not None else None
        hms = HM.unbind(0) if HM is not None else None
        U = x.new_empty(T, B, H)
        us = U.unbind(0)
        a_rz = A[:, :, :2 * H].unbind(0)
        a_r = A[:, :, :H].unbind(0)
        a_z = A[:, :, H:2 * H].unbind(0)
        a_n = A[:, :, 2 * H:].unbind(0)
        w_rz_t = w_hh[:2 * H].t()
        w_n_t = w_hh[2 * H:].t()
        w_hh_t = w_hh.t()
        for t in range(T):
            hp = hs[t]
            hh = hp if hms is None else torch.mul(hp, h_mask, out=hms[t])
            if reset_after:
                rec = torch.mm(hh, w_hh_t)
                a_rz[t].add_(rec[:, :2 * H]).sigmoid_()
                torch.add(rec[:, 2 * H:], bias_hh, out=us[t])
                a_n[t].addcmul_(a_r[t], us[t]).tanh_()
            else:
                a_rz[t].addmm_(hh, w_rz_t).sigmoid_()  # eqs 56, 57
                torch.mul(a_r[t], hh, out=us[t])
                a_n[t].addmm_(us[t], w_n_t).tanh_()  # eq 58
            torch.lerp(hp, a_n[t], a_z[t], out=hs[t + 1])  # eq 59: (1 - z) h' + z n
        out = _masked_outputs(Hs[1:], lengths)
        hn = _final(Hs, lengths)
        ctx.reset_after = reset_after
        ctx.save_for_backward(x, w_ih, w_hh, bias, bias_hh, h_mask, lengths, A, Hs, HM, U)
        return out, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        x, w_ih, w_hh, bias, bias_hh, h_mask, lengths, A, Hs, HM, U = ctx.saved_tensors
        reset_after = ctx.reset_after
        T, B, _ = x.shape
        H = Hs.shape[-1]
        DH, dh0_direct = _state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        dhs = DH.unbind(0)
        Hp = Hs[:-1]
        HH = Hp if HM is None else HM  # h_{t-1}' (what the products read)
        if ctx.native is not None:
            G = A.new_empty(T, B, 3, H)
            dZn = A.new_empty(T, B, H)
            dh0 = A.new_empty(B, H)
            scratch = A.new_empty(B, H)
            fn = ctx.native.gru_bwd_f if A.dtype == torch.float32 else ctx.native.gru_bwd_d
            fn(T, B, H, int(bool(reset_after)), _ptr(A), _ptr(Hs), _ptr(U), _ptr(HM), _ptr(DH),
               _ptr(G), _ptr(dZn), _ptr(dh0), _ptr(w_hh), _ptr(h_mask), _ptr(scratch), PAR_MIN)
            dh0 = _add(dh0, dh0_direct)
            return _RecurrentGRU._weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0)
        A3 = A.view(T, B, 3, H)
        r, z, n = A3[:, :, 0], A3[:, :, 1], A3[:, :, 2]
        # derivative factors of all steps at once
        K = A.new_empty(T, B, 3, H)
        torch.mul(n - Hp, z * (1 - z), out=K[:, :, 1])  # d a_z = dh * K_z
        torch.mul(1 - n * n, z, out=K[:, :, 2])  # d a_n = dh * K_n
        if reset_after:
            torch.mul(U, r * (1 - r), out=K[:, :, 0])  # d a_r = d a_n * K_r
        else:
            torch.mul(HH, r * (1 - r), out=K[:, :, 0])  # d a_r = du * K_r
        keep = 1 - z
        # G: gradients of the recurrent products' outputs (r, z, candidate) per step
        G = A.new_empty(T, B, 3, H)
        dZn = A.new_empty(T, B, H)  # d a_n (input side of the candidate block)
        gs, ks, dzns = G.unbind(0), K.unbind(0), dZn.unbind(0)
        keeps, rs = keep.unbind(0), r.unbind(0)
        w_rz = w_hh[:2 * H]
        w_n = w_hh[2 * H:]
        hms = h_mask
        for t in range(T - 1, -1, -1):
            dh = dhs[t]
            g = gs[t]
            k = ks[t]
            torch.mul(k[:, 1:], dh.unsqueeze(1), out=g[:, 1:])  # d a_z, d a_n (reset_before)
            if reset_after:
                dzns[t].copy_(g[:, 2])
                torch.mul(g[:, 2], k[:, 0], out=g[:, 0])  # d a_r = d a_n * W_n h' ...
                g[:, 2].mul_(rs[t])  # d (W_hh,n h' + b_hh) = d a_n * r
                dhh = torch.mm(g.reshape(B, 3 * H), w_hh)
            else:
                dzns[t].copy_(g[:, 2])
                du = torch.mm(g[:, 2], w_n)  # d (r * h')
                torch.mul(du, k[:, 0], out=g[:, 0])  # d a_r
                dhh = torch.mul(du, rs[t])
                dhh.addmm_(g[:, :2].reshape(B, 2 * H), w_rz)
            if hms is not None:
                dhh.mul_(hms)
            dprev = dhh.addcmul_(dh, keeps[t])  # + dh * (1 - z): eq 59's direct path
            if t > 0:
                dhs[t - 1].add_(dprev)
            else:
                dh0 = dprev
        dh0 = _add(dh0, dh0_direct)
        return _RecurrentGRU._weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0)

    @staticmethod
    def _weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0):
        """Input and weight gradients: one matrix product each, over all steps."""
        reset_after = ctx.reset_after
        need = ctx.needs_input_grad
        T, B, _ = x.shape
        H = HH.shape[-1]
        # input side: dZ = [d a_r, d a_z, d a_n]
        G2 = G.view(T * B, 3 * H)
        dZ = torch.cat([G[:, :, :2].reshape(T, B, 2 * H), dZn], dim=-1).view(T * B, 3 * H)
        dx = torch.mm(dZ, w_ih).view(x.shape) if need[1] else None
        dw_ih = torch.mm(dZ.t(), x.reshape(T * B, -1)) if need[3] else None
        db = dZ.sum(0) if bias is not None and need[5] else None
        dw_hh = dbhh = None
        if need[4]:
            HH2 = HH.reshape(T * B, H)
            if reset_after:
                dw_hh = torch.mm(G2.t(), HH2)
            else:
                dw_hh = torch.cat([torch.mm(G2[:, :2 * H].t(), HH2),
                                   torch.mm(G2[:, 2 * H:].t(), U.reshape(T * B, H))])
        if reset_after and bias_hh is not None and need[6]:
            dbhh = G2[:, 2 * H:].sum(0)
        return None, dx, dh0 if need[2] else None, dw_ih, dw_hh, db, dbhh, None, None
