"""Fast paths for the second-order cells: ``mrnn``, ``mlstm``, ``mmrnn``, ``mmlstm``, ``dyck-rnn``.

The equations and parameter layouts are those of :mod:`lstmablate.cells.multiplicative`
and :mod:`lstmablate.cells.dyck`; nothing here changes them.  Each kernel is a
``torch.autograd.Function`` with a hand-written BPTT in plain PyTorch operations
(so it runs on any device PyTorch supports), written the way the PyTorch-loop
kernels of :mod:`lstmablate.cells.fused` are.  ``mrnn``, ``mlstm``, ``mmrnn`` and
``mmlstm`` also have their loops in C (:data:`_C_SECOND_ORDER`, compiled into the native
kernel of ``fused``; taken on CPU in float32 / float64 wherever that kernel builds, the
PyTorch loops otherwise: another device, ``LSTMABLATE_NATIVE=0``, no compiler or BLAS;
:func:`kernel_name` says which):

* everything that depends on x alone is ONE matrix product for all steps;
* per step only what reads h_{t-1}, with in-place operations on buffers
  allocated once per call (per-step views made up front with ``unbind``);
* the backward loop does only what sits on the recurrence; the derivative
  factors of the element-wise work are computed for all steps before it, and
  the input and weight gradients are ONE matrix product each over all steps
  after it;
* padding: prefix masks (what the encoder makes) run every row over all T
  steps and take each sequence's final state at its last real step (its
  initial state for length 0); outputs are zero at padding.  Nothing after a
  sequence's end feeds anything the caller sees, so outputs, final states and
  all gradients are those of the reference loop.  Masks with holes, autocast,
  CPU dtypes other than float32/float64, parameters of another dtype or device
  than the input, and subclasses that override the cell's arithmetic take the
  reference loop (:func:`plan`); so does everything under
  ``fused.reference_mode()`` / ``LSTMABLATE_REFERENCE=1``.
* recurrent dropout (``h_mask``) is supported everywhere: h_{t-1} * h_mask is
  what the recurrent products read (and is kept for the weight gradients).
* the per-step products with the recurrent weights (B rows each) go through
  :class:`_StepProduct`: on CPU in float32 a weight of at least :data:`PACK_MIN`
  entries is packed once per call for MKL's packed GEMM (``torch.ops.mkl``, as
  the native LSTM kernel of ``fused`` packs its weights;
  ``LSTMABLATE_PACKED_GEMM=0`` turns it off), any other weight is made
  row-major (in, out) once and each step calls ``mm``.

Per cell (B rows, H hidden, F factors, K_g choice matrices per block, K = sum K_g):

``mrnn`` / ``mlstm`` (:class:`_FactoredRecurrence`)
    Up front: A = x W_mx^T (T, B, F) and Z = x W_x^T + b (T, B, n*H).  Per step:
    P_t = h'_{t-1} W_mh^T, M_t = A_t * P_t, Z_t += M_t W_hm^T, then tanh (mrnn) or
    the LSTM element-wise work (mlstm; blocks i, f, o, u).  Backward per step:
    dZ_t from dh_t (and dc_t), dM_t = dZ_t W_hm, dP_t = dM_t * A_t,
    dh_{t-1} += dP_t W_mh.  After the loop dA = dM * P and
    dW_ih = [dA, dZ]^T X, dW_mh = dP^T H', dW_hm = dZ^T M, dX = [dA, dZ] W_ih.
    Native: the same buffers; each loop is one C call (``factored_fwd`` /
    ``factored_bwd``: per step the two products through MKL's packed GEMM in float32,
    sgemm_/dgemm_ otherwise, and each piece of element-wise work one fused pass; the
    backward writes dA_t = dM_t * P_t in the loop), and the weight gradients stay here.

``mmrnn`` / ``mmlstm`` (:class:`_MultiMatrixRecurrence`)
    The key recurrences of all blocks are one: v_{t-1} (B, K) is the concatenated
    keys and ``torch.block_diag`` of the ``key_weights`` (K x K) maps it to every
    block's logits in one product (its gradient goes back to the blocks through
    ``block_diag``'s own autograd).  Up front: the x-columns of all key
    projections (T, B, K) and all W_g^hx x_t (T, B, n*H).  Per step: logits +=
    h' W_key^T + v_{t-1} BD^T; a softmax per block (one call for all blocks when
    the K_g are equal); R_t = h' W_choice^T (B, K*H): every W_g[j] h'; the mixture
    sum_j v_g[j] W_g[j] h' as ONE batched product (B*n batches of 1 x K_g times
    K_g x H) added in place to the pre-activations; then tanh / the LSTM work.
    Backward per step: d pre-activations; dv_t += R_t . d pre (a batched product);
    dR_t = v_t (x) d pre (an outer product written straight into the gradient of
    the recurrent product); the softmax backward (one call); then ONE product
    dh_{t-1} += [d logits, dR_t] W_hh and the key carry dv_{t-1} += d logits BD.
    After the loop: dW_hh = [d logits, dR]^T H' (one product), dBD, dW_ih, dX.
    Native: one C call per loop (``multi_fwd`` / ``multi_bwd``); per step ONE product
    h' W_hh^T for the key h-columns and all choice matrices together (kept whole,
    (T, B, K + K*H), for the backward), the tiny v_{t-1} BD^T, and per row the
    logits, the softmaxes, the mixture and the activations in one pass; backward:
    per row d pre, dv_t, dR_t and the softmax backward in one pass, then the two
    products dh_{t-1} += [d logits, dR_t] W_hh and dv_{t-1} += d logits BD.

``dyck-rnn`` (:class:`_DyckRecurrence`)
    ``project_inputs`` (g_t and g_t W^hx x_t for all steps) stays ordinary
    autograd; per step one product with the stacked shift matrices [W_1; W_2]
    (fixed buffers) and h_t = g_t W_1 h' + (1 - g_t) W_2 h' + g_t W^hx x_t as two
    ``addcmul``; backward per step one outer product and one matrix product; dg
    for all steps after the loop.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import fused as _fused
from .fused import (
    _add,
    _autocast_on,
    _final,
    _masked_outputs,
    _native_for,
    _outputs,
    _ptr,
    _state_grads_into_steps,
    mask_kind,
    reference_forced,
)

State = tuple[Tensor, ...]

#: the methods that define a cell's arithmetic; a subclass that overrides one of them
#: is not what the kernels compute, so it runs the reference loop
_MATH = ("step", "memory_step", "_recurrent", "_mixed", "project_inputs")


def _classes() -> dict[type, str]:
    from .dyck import DyckRNNCell
    from .multiplicative import MLSTMCell, MMLSTMCell, MMRNNCell, MRNNCell

    return {MRNNCell: "factored", MLSTMCell: "factored", MMRNNCell: "multi-matrix",
            MMLSTMCell: "multi-matrix", DyckRNNCell: "dyck"}


def cell_kind(cell) -> str | None:
    """``"factored"`` (mrnn, mlstm), ``"multi-matrix"`` (mmrnn, mmlstm), ``"dyck"``, or None
    (not one of these cells, or a subclass that overrides its arithmetic)."""
    for cls, kind in _classes().items():
        if isinstance(cell, cls):
            if all(getattr(type(cell), m, None) is getattr(cls, m, None) for m in _MATH):
                return kind
            return None
    return None


def plan(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
         mask: str = "none", h_mask: bool = False, autocast: bool = False,
         reference: bool | None = None) -> str:
    """Which kernel a call of an mrnn / mlstm / mmrnn / mmlstm / dyck-rnn cell runs:
    ``"recurrent"`` (the kernels of this module) or ``"reference"`` (the step loop).

    ``mask`` is the :func:`~lstmablate.cells.fused.mask_kind` of the call's mask;
    ``reference`` (default: :func:`~lstmablate.cells.fused.reference_forced`) forces the
    reference loop.  ``h_mask`` (recurrent dropout) is supported by every kernel.
    """
    del h_mask  # supported everywhere; kept for the same signature as fused.plan
    if reference is None:
        reference = reference_forced()
    kind = cell_kind(cell)
    if kind is None or reference or autocast or mask == "other" or not dtype.is_floating_point:
        return "reference"
    if dtype not in (torch.float32, torch.float64) and device_type == "cpu":
        return "reference"
    if kind == "dyck" and (cell.shift_push.requires_grad or cell.shift_pop.requires_grad):
        return "reference"  # the shift matrices are fixed buffers; trained ones: reference
    return "recurrent"


def fast_path_available(cell) -> bool:
    """Does this cell have a fast path for a plain float32 CPU call?"""
    return plan(cell, reference=False) != "reference"


#: the cell kinds whose loops have a native (C) implementation in the native kernel of ``fused``
NATIVE_KINDS = ("factored", "multi-matrix")


def kernel_name(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
                mask: str = "none", h_mask: bool = False, autocast: bool = False,
                reference: bool | None = None) -> str:
    """The kernel a call runs, as the benchmark names it: ``"reference"``,
    ``"recurrent (native)"`` (the loops in C: mrnn, mlstm, mmrnn, mmlstm on CPU in
    float32 / float64 where the native kernel builds) or ``"recurrent (pytorch)"`` (the
    PyTorch loops of this module).  Arguments as :func:`plan`."""
    p = plan(cell, device_type=device_type, dtype=dtype, mask=mask, h_mask=h_mask,
             autocast=autocast, reference=reference)
    if p == "reference":
        return p
    native = (cell_kind(cell) in NATIVE_KINDS
              and _fused.native_kernel_for(device_type, dtype) is not None)
    return p + (" (native)" if native else " (pytorch)")


def forward(cell, x: Tensor, state: State | None, mask: Tensor | None,
            h_mask: Tensor | None) -> tuple[Tensor, State] | None:
    """The fast path of one of these cells, or None (the caller runs the reference loop)."""
    if reference_forced() or x.dim() != 3:
        return None
    kind, lengths = mask_kind(mask)
    path = plan(cell, device_type=x.device.type, dtype=x.dtype, mask=kind,
                h_mask=h_mask is not None, autocast=_autocast_on(x))
    if path == "reference":
        return None
    T, B = x.shape[0], x.shape[1]
    if state is None:
        state = cell.initial_state(B, x)
    state = tuple(state)
    tensors = list(cell.parameters()) + list(state) + ([h_mask] if h_mask is not None else [])
    if any(t.dtype != x.dtype or t.device != x.device for t in tensors):
        return None  # let the reference loop raise (or promote) as it would
    if T == 0:
        return x.new_zeros(0, B, cell.output_size), state
    if lengths is not None:
        lengths = lengths.to(x.device)
    ck = cell_kind(cell)
    if ck == "factored":
        return _factored(cell, x, state, lengths, h_mask)
    if ck == "multi-matrix":
        return _multi_matrix(cell, x, state, lengths, h_mask)
    return _dyck(cell, x, state, lengths, h_mask)


# ---------------------------------------------------------------------------------
# the per-step matrix products
# ---------------------------------------------------------------------------------

#: pack a per-step weight for MKL's packed GEMM (float32 CPU) when it has at least this many
#: entries; below it plain ``mm`` is as fast.  ``LSTMABLATE_PACKED_GEMM=0`` turns packing off.
PACK_MIN = 300_000
#: ... and only for calls of at least this many steps (packing costs about two products)
PACK_MIN_STEPS = 4


def _packing_available() -> bool:
    try:
        return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")
    except (AttributeError, RuntimeError):
        return False



def _lstm_factors(Z4: Tensor, C: Tensor, TC: Tensor) -> tuple[Tensor, Tensor]:
    """Derivative factors of all steps of an LSTM-style memory cell.

    ``Z4`` (T, B, 4, H) holds the activations i, f, o and the content u; ``C`` the
    memory c_0..c_T and ``TC`` tanh(c_1..c_T).  Returns ``K`` with dz_{i,f,u} = dc * K
    and dz_o = dh * K_o, and ``Kc`` with dc += dh * Kc.
    """
    G, u, o = Z4[:, :, :3], Z4[:, :, 3], Z4[:, :, 2]
    K = Z4.new_empty(Z4.shape)
    sd = G * (1 - G)
    torch.mul(sd[:, :, 0], u, out=K[:, :, 0])
    torch.mul(sd[:, :, 1], C[:-1], out=K[:, :, 1])
    torch.mul(sd[:, :, 2], TC, out=K[:, :, 2])
    torch.mul(1 - u * u, G[:, :, 0], out=K[:, :, 3])
    Kc = 1 - TC * TC
    Kc.mul_(o)
    return K, Kc

class _StepProduct:
    """``a @ w`` for the B-row products of every step, ``w`` given as (in, out).

    On CPU in float32, a large ``w`` is packed once per call for MKL's packed GEMM
    (``torch.ops.mkl._mkl_linear``, what PyTorch's own frozen linear layers use): the
    per-step products have only B rows and stream the whole weight each time, which
    the packed layout does markedly faster (1.3-1.6x at 650 x 2600 and 650 x 10400).
    Otherwise ``w`` is made row-major (in, out) once and the steps call ``mm``.
    """

    def __init__(self, w: Tensor, rows: int, steps: int):
        self.rows = rows
        self.packed = None
        if (w.device.type == "cpu" and w.dtype == torch.float32 and w.numel() >= PACK_MIN
                and steps >= PACK_MIN_STEPS
                and os.environ.get("LSTMABLATE_PACKED_GEMM", "1") != "0" and _packing_available()):
            self.w_out_in = w.t().contiguous()  # (out, in): nn.Linear's layout
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.w_out_in, rows)
        else:
            self.w = w.contiguous()

    def __call__(self, a: Tensor, out: Tensor | None = None) -> Tensor:
        if self.packed is not None and a.shape[0] == self.rows:
            y = torch.ops.mkl._mkl_linear(a, self.packed, self.w_out_in, None, self.rows)
            return y if out is None else out.copy_(y)
        w = self.w if self.packed is None else self.w_out_in.t()
        return torch.mm(a, w) if out is None else torch.mm(a, w, out=out)

    def add_to(self, acc: Tensor, a: Tensor) -> Tensor:
        """acc += a @ w (in place)."""
        if self.packed is not None:
            return acc.add_(self(a))
        return acc.addmm_(a, self.w)


# ---------------------------------------------------------------------------------
# the native loops (mRNN, mLSTM, mmRNN, mmLSTM): plain C
# ---------------------------------------------------------------------------------
#
# Compiled into the native kernel of ``fused`` (``fused._c_source`` appends this after the LSTM
# kernels, once per real type, so ``{real}``, ``SFX``, ``EXP``/``TANH``, ``SFX(gemm)``,
# ``SFX(sig)``, ``STEP_MM`` (packed GEMM or BLAS), ``SFX(dropped)`` and ``SFX(add_masked)`` are
# theirs; it is built, cached and loaded with them).  Each
# function is one whole loop, forward or backward, filling the buffers the PyTorch loops fill.
_C_SECOND_ORDER = r"""/* ---- the second-order cells (lstmablate/cells/fused_multiplicative.py) ---- */

/* One row of the LSTM-style memory cell of mLSTM / mmLSTM.  z (4H): the pre-activations of the
   blocks i, f, o, u (mmLSTM: c^) in, their activations out; cp = c_{{t-1}}, c = c_t, tc = tanh(c_t),
   h = h_t out. */
static inline void SFX(lstm_row)(const int H, {real}* z, const {real}* cp, {real}* c, {real}* tc,
                                 {real}* h) {{
    {real}* zi = z; {real}* zf = z + H; {real}* zo = z + 2 * H; {real}* zu = z + 3 * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {{
        {real} i = SFX(sig)(zi[j]), f = SFX(sig)(zf[j]), o = SFX(sig)(zo[j]);  /* i, f, o = sigma(.) */
        {real} u = TANH(zu[j]);  /* u = tanh(.) */
        {real} cc = f * cp[j] + i * u;  /* c_t = f_t * c_{{t-1}} + i_t * u_t */
        {real} th = TANH(cc);
        zi[j] = i; zf[j] = f; zo[j] = o; zu[j] = u;
        c[j] = cc; tc[j] = th;
        h[j] = o * th;  /* h_t = o_t * tanh(c_t) */
    }}
}}

/* Its backward: a (4H) the activations i, f, o, u; dh = dh_t, dcin = dc_t from later steps and the
   final state; dz (4H) out; carry: dc_{{t-1}} (+)= dc_t * f_t (= when first). */
static inline void SFX(lstm_row_bwd)(const int H, const {real}* a, const {real}* cp, const {real}* tc,
                                     const {real}* dh, const {real}* dcin, {real}* dz, {real}* carry,
                                     const int first) {{
    const {real}* ai = a; const {real}* af = a + H; const {real}* ao = a + 2 * H; const {real}* au = a + 3 * H;
    {real}* di = dz; {real}* df = dz + H; {real}* dO = dz + 2 * H; {real}* du = dz + 3 * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {{
        {real} i = ai[j], f = af[j], o = ao[j], u = au[j], th = tc[j], d = dh[j];
        {real} dc = dcin[j] + d * o * (1 - th * th);  /* dc_t += dh_t * o_t * tanh'(c_t) */
        di[j] = dc * u * i * (1 - i);
        df[j] = dc * cp[j] * f * (1 - f);
        dO[j] = d * th * o * (1 - o);
        du[j] = dc * i * (1 - u * u);
        carry[j] = first ? dc * f : carry[j] + dc * f;  /* dc_{{t-1}} += dc_t * f_t */
    }}
}}

/* ---- mRNN / mLSTM (_FactoredRecurrence) ----------------------------------------------------
   Buffers as the PyTorch loops: A (T,B,F) = W_mx x_t; Z (T,B,nH) = W_x x_t + b in, then
   + W_hm m_t (mLSTM: the activations i, f, o, u in place); P (T,B,F) = h'_{{t-1}} W_mh^T out;
   M (T,B,F) = m_t out; Hs (T+1,B,H) with Hs[0] = h_0; HM (T,B,H) = h_{{t-1}} * hmask (if hmask);
   mLSTM: C (T+1,B,H) with C[0] = c_0, TC (T,B,H) = tanh(c_t). */
int SFX(factored_fwd)(int memory, int T, int B, int H, int F, long par_min, const {real}* A,
                      {real}* Z, {real}* P, {real}* M, {real}* Hs, {real}* HM, {real}* C, {real}* TC,
                      const {real}* w_mh, const {real}* w_hm, const {real}* hmask) {{
    const int nH = (memory ? 4 : 1) * H;
    const long BF = (long)B * F, BH = (long)B * H;
#if CAN_PACK
    float* p_mh = la_pack(1, B, F, H, w_mh, H);  /* h' W_mh^T */
    float* p_hm = la_pack(1, B, nH, F, w_hm, F);  /* m W_hm^T */
#endif
    for (int t = 0; t < T; ++t) {{
        const {real}* hp = Hs + t * BH;
        const {real}* a = A + t * BF;
        {real}* p = P + t * BF;
        {real}* m = M + t * BF;
        {real}* z = Z + (long)t * B * nH;
        {real}* hn = Hs + (t + 1) * BH;
        hp = SFX(dropped)(hp, hmask, hmask ? HM + t * BH : 0, BH);  /* h' = h_{{t-1}} * h_mask */
        STEP_MM(p_mh, 1, B, F, H, hp, H, w_mh, H, 0, p, F);  /* P_t = h' W_mh^T */
        #pragma omp simd
        for (long e = 0; e < BF; ++e) m[e] = a[e] * p[e];  /* m_t = (W_mx x_t) * (W_mh h') */
        STEP_MM(p_hm, 1, B, nH, F, m, F, w_hm, F, 1, z, nH);  /* Z_t += m_t W_hm^T */
        if (!memory) {{
            #pragma omp simd
            for (long e = 0; e < BH; ++e) hn[e] = TANH(z[e]);  /* h_t = tanh(W_hm m_t + W_hx x_t + b) */
            continue;
        }}
        #pragma omp parallel for schedule(static) if (BH >= par_min)
        for (int b = 0; b < B; ++b)
            SFX(lstm_row)(H, z + (long)b * nH, C + t * BH + (long)b * H, C + (t + 1) * BH + (long)b * H,
                          TC + t * BH + (long)b * H, hn + (long)b * H);
    }}
#if CAN_PACK
    free(p_mh); free(p_hm);
#endif
    return 0;
}}

/* Backward (reverse).  DH (T,B,H): dh_t from the outputs and the final state; the recurrent
   part is added in place.  DC (T,B,H) (mLSTM): dc_t from the final state; the carry from
   t+1 is added in place.  dXP (T,B,F+nH) out: [dA_t, dZ_t] (dA = dM * P); DP (T,B,F) out:
   dP_t = dM_t * A_t; dh0 (B,H), dc0 (B,H) out; tmp (B*F + B*H) scratch. */
int SFX(factored_bwd)(int memory, int T, int B, int H, int F, long par_min, const {real}* A,
                      const {real}* P, const {real}* Z, const {real}* C, const {real}* TC,
                      const {real}* Hs, {real}* DH, {real}* DC, {real}* dXP, {real}* DP, {real}* dh0,
                      {real}* dc0, const {real}* w_mh, const {real}* w_hm, const {real}* hmask,
                      {real}* tmp) {{
    const int nH = (memory ? 4 : 1) * H, ld = F + nH;
    const long BF = (long)B * F, BH = (long)B * H;
    {real}* dm = tmp;
    {real}* g = tmp + BF;
#if CAN_PACK
    float* p_hm = la_pack(0, B, F, nH, w_hm, F);  /* dZ W_hm */
    float* p_mh = la_pack(0, B, H, F, w_mh, H);  /* dP W_mh */
#endif
    for (int t = T - 1; t >= 0; --t) {{
        const {real}* dh = DH + t * BH;
        {real}* dx = dXP + (long)t * B * ld;
        {real}* dz = dx + F;
        if (!memory) {{
            const {real}* h = Hs + (t + 1) * BH;
            for (int b = 0; b < B; ++b) {{
                const {real}* hb = h + (long)b * H; const {real}* dhb = dh + (long)b * H;
                {real}* dzb = dz + (long)b * ld;
                #pragma omp simd
                for (int j = 0; j < H; ++j) dzb[j] = dhb[j] * (1 - hb[j] * hb[j]);  /* dz = dh * tanh' */
            }}
        }} else {{
            {real}* carry = t > 0 ? DC + (t - 1) * BH : dc0;
            const int first = t == 0;
            #pragma omp parallel for schedule(static) if (BH >= par_min)
            for (int b = 0; b < B; ++b)
                SFX(lstm_row_bwd)(H, Z + (long)t * B * nH + (long)b * nH, C + t * BH + (long)b * H,
                                  TC + t * BH + (long)b * H, dh + (long)b * H, DC + t * BH + (long)b * H,
                                  dz + (long)b * ld, carry + (long)b * H, first);
        }}
        STEP_MM(p_hm, 0, B, F, nH, dz, ld, w_hm, F, 0, dm, F);  /* dM_t = dZ_t W_hm */
        const {real}* a = A + t * BF;
        const {real}* p = P + t * BF;
        {real}* dp = DP + t * BF;
        for (int b = 0; b < B; ++b) {{
            const {real}* dmb = dm + (long)b * F; const {real}* ab = a + (long)b * F;
            const {real}* pb = p + (long)b * F;
            {real}* dpb = dp + (long)b * F; {real}* dab = dx + (long)b * ld;
            #pragma omp simd
            for (int j = 0; j < F; ++j) {{
                dpb[j] = dmb[j] * ab[j];  /* dP_t = dM_t * A_t */
                dab[j] = dmb[j] * pb[j];  /* dA_t = dM_t * P_t */
            }}
        }}
        {real}* target = t > 0 ? DH + (t - 1) * BH : dh0;
        /* dh_{{t-1}} += dP_t W_mh; with recurrent dropout dh' = dP_t W_mh, then += dh' * h_mask */
        STEP_MM(p_mh, 0, B, H, F, dp, F, w_mh, H, !hmask && t > 0, hmask ? g : target, H);
        if (hmask) SFX(add_masked)(target, g, hmask, BH, t > 0);
    }}
#if CAN_PACK
    free(p_hm); free(p_mh);
#endif
    return 0;
}}

/* ---- mmRNN / mmLSTM (_MultiMatrixRecurrence) ------------------------------------------------
   Ks (n): K_g of each block g; K = sum K_g; KR = K + K*H.  Buffers as the PyTorch loops, except
   that R (T,B,KR) holds the whole per-step product h'_{{t-1}} W_hh^T: [h' W_key^T, every
   W_g[j] h'].  XK (T,B,K): x-columns of the key logits (+ bias) in, logits out; V (T+1,B,K) with
   V[0] = v_0; XP (T,B,nH): W_g^hx x_t (+ bias) in, + the mixture, then (mmLSTM) the activations
   i, f, o, c^ in place; Hs, HM, C, TC as in factored_fwd.  bd (K,K): block_diag of the key
   weights. */
int SFX(multi_fwd)(int memory, int n, const int* Ks, int T, int B, int H, long par_min, {real}* XK,
                   {real}* V, {real}* R, {real}* XP, {real}* Hs, {real}* HM, {real}* C, {real}* TC,
                   const {real}* w_hh, const {real}* bd, const {real}* hmask) {{
    int K = 0;
    for (int g = 0; g < n; ++g) K += Ks[g];
    const int KR = K + K * H, nH = n * H;
    const long BH = (long)B * H;
#if CAN_PACK
    float* pw = la_pack(1, B, KR, H, w_hh, H);  /* h' W_hh^T */
#endif
    for (int t = 0; t < T; ++t) {{
        const {real}* hp = Hs + t * BH;
        {real}* xk = XK + (long)t * B * K;
        const {real}* vp = V + (long)t * B * K;
        {real}* vn = V + (long)(t + 1) * B * K;
        {real}* r = R + (long)t * B * KR;
        {real}* pre = XP + (long)t * B * nH;
        {real}* hn = Hs + (t + 1) * BH;
        hp = SFX(dropped)(hp, hmask, hmask ? HM + t * BH : 0, BH);  /* h' = h_{{t-1}} * h_mask */
        STEP_MM(pw, 1, B, KR, H, hp, H, w_hh, H, 0, r, KR);  /* R_t = h' W_hh^T: key h-columns, every W_g[j] h' */
        /* logits += v_{{t-1}} BD^T (the keys' own recurrence) */
        SFX(gemm)(1, B, K, K, vp, K, bd, K, 1, xk, K);
        #pragma omp parallel for schedule(static) if ((long)B * K * H >= par_min)
        for (int b = 0; b < B; ++b) {{
            {real}* lg = xk + (long)b * K;
            const {real}* rb = r + (long)b * KR;
            {real}* vb = vn + (long)b * K;
            {real}* pb = pre + (long)b * nH;
            for (int e = 0; e < K; ++e) lg[e] += rb[e];  /* eqs 6 / 9-15: logits = W^proj [v; h'; x] */
            for (int g = 0, ko = 0; g < n; ko += Ks[g], ++g) {{
                {real} mx = lg[ko], s = 0;
                for (int j = 1; j < Ks[g]; ++j) mx = lg[ko + j] > mx ? lg[ko + j] : mx;
                for (int j = 0; j < Ks[g]; ++j) {{ vb[ko + j] = EXP(lg[ko + j] - mx); s += vb[ko + j]; }}
                for (int j = 0; j < Ks[g]; ++j) vb[ko + j] /= s;  /* v_g,t = softmax(logits_g) */
                {real}* pg = pb + (long)g * H;
                for (int j = 0; j < Ks[g]; ++j) {{
                    const {real} w = vb[ko + j];
                    const {real}* m = rb + K + (long)(ko + j) * H;
                    /* eqs 7 / 10-16: pre_g += sum_j v_g[j] (W_g[j] h') */
                    #pragma omp simd
                    for (int i = 0; i < H; ++i) pg[i] += w * m[i];
                }}
            }}
            if (!memory) {{
                {real}* hb = hn + (long)b * H;
                #pragma omp simd
                for (int i = 0; i < H; ++i) hb[i] = TANH(pb[i]);  /* eq 8: h_t = tanh(pre) */
            }} else {{
                SFX(lstm_row)(H, pb, C + t * BH + (long)b * H, C + (t + 1) * BH + (long)b * H,
                              TC + t * BH + (long)b * H, hn + (long)b * H);  /* eqs 17-22 */
            }}
        }}
    }}
#if CAN_PACK
    free(pw);
#endif
    return 0;
}}

/* Backward (reverse).  DH (T,B,H), DC (T,B,H) as in factored_bwd; DV (T,B,K): dv_t from the final
   keys, the carry from t+1 and R_t . d pre added in place.  DPRE (T,B,nH) out: d pre-activations;
   dR (T,B,KR) out: [d logits, d (W_g[j] h')], the gradient of R_t; DL (T,B,K) out: d logits;
   dh0 (B,H), dv0 (B,K), dc0 (B,H) out; tmp (B*H) scratch. */
int SFX(multi_bwd)(int memory, int n, const int* Ks, int T, int B, int H, long par_min,
                   const {real}* V, const {real}* R, const {real}* XP, const {real}* C, const {real}* TC,
                   const {real}* Hs, {real}* DH, {real}* DV, {real}* DC, {real}* DPRE, {real}* dR, {real}* DL,
                   {real}* dh0, {real}* dv0, {real}* dc0, const {real}* w_hh, const {real}* bd,
                   const {real}* hmask, {real}* tmp) {{
    int K = 0;
    for (int g = 0; g < n; ++g) K += Ks[g];
    const int KR = K + K * H, nH = n * H;
    const long BH = (long)B * H;
#if CAN_PACK
    float* pw = la_pack(0, B, H, KR, w_hh, H);  /* dR W_hh */
#endif
    for (int t = T - 1; t >= 0; --t) {{
        const {real}* dh = DH + t * BH;
        const {real}* vt = V + (long)(t + 1) * B * K;
        const {real}* r = R + (long)t * B * KR;
        {real}* dv = DV + (long)t * B * K;
        {real}* dpre = DPRE + (long)t * B * nH;
        {real}* dr = dR + (long)t * B * KR;
        {real}* dl = DL + (long)t * B * K;
        {real}* carry = memory ? (t > 0 ? DC + (t - 1) * BH : dc0) : 0;
        const int first = t == 0;
        #pragma omp parallel for schedule(static) if ((long)B * K * H >= par_min)
        for (int b = 0; b < B; ++b) {{
            {real}* dpb = dpre + (long)b * nH;
            const {real}* dhb = dh + (long)b * H;
            if (!memory) {{
                const {real}* hb = Hs + (t + 1) * BH + (long)b * H;
                #pragma omp simd
                for (int i = 0; i < H; ++i) dpb[i] = dhb[i] * (1 - hb[i] * hb[i]);  /* d pre = dh * tanh' */
            }} else {{
                SFX(lstm_row_bwd)(H, XP + (long)t * B * nH + (long)b * nH, C + t * BH + (long)b * H,
                                  TC + t * BH + (long)b * H, dhb, DC + t * BH + (long)b * H, dpb,
                                  carry + (long)b * H, first);
            }}
            const {real}* vb = vt + (long)b * K;
            const {real}* rb = r + (long)b * KR;
            {real}* dvb = dv + (long)b * K;
            {real}* drb = dr + (long)b * KR;
            {real}* dlb = dl + (long)b * K;
            for (int g = 0, ko = 0; g < n; ko += Ks[g], ++g) {{
                const {real}* dpg = dpb + (long)g * H;
                {real} s = 0;
                for (int j = 0; j < Ks[g]; ++j) {{
                    const {real}* m = rb + K + (long)(ko + j) * H;
                    {real}* dm = drb + K + (long)(ko + j) * H;
                    const {real} w = vb[ko + j];
                    {real} dot = 0;
                    #pragma omp simd reduction(+:dot)
                    for (int i = 0; i < H; ++i) {{
                        dot += m[i] * dpg[i];  /* dv_g[j] += (W_g[j] h') . d pre_g */
                        dm[i] = w * dpg[i];  /* d (W_g[j] h') = v_g[j] d pre_g */
                    }}
                    dvb[ko + j] += dot;
                    s += w * dvb[ko + j];
                }}
                for (int j = 0; j < Ks[g]; ++j) {{
                    const {real} d = vb[ko + j] * (dvb[ko + j] - s);  /* softmax': d logits = v (dv - v.dv) */
                    dlb[ko + j] = d;
                    drb[ko + j] = d;
                }}
            }}
        }}
        {real}* target = t > 0 ? DH + (t - 1) * BH : dh0;
        /* dh_{{t-1}} += [d logits, dR_t] W_hh; with recurrent dropout via dh', then * h_mask */
        STEP_MM(pw, 0, B, H, KR, dr, KR, w_hh, H, !hmask && t > 0, hmask ? tmp : target, H);
        if (hmask) SFX(add_masked)(target, tmp, hmask, BH, t > 0);
        /* dv_{{t-1}} += d logits BD (the keys' own recurrence) */
        SFX(gemm)(0, B, K, K, dl, K, bd, K, t > 0 ? 1 : 0, t > 0 ? DV + (long)(t - 1) * B * K : dv0, K);
    }}
#if CAN_PACK
    free(pw);
#endif
    return 0;
}}

#undef STEP_MM
"""


# ---------------------------------------------------------------------------------
# mRNN and mLSTM: m_t = (W_mx x_t) * (W_mh h_{t-1})
# ---------------------------------------------------------------------------------

def _state_buffers(x: Tensor, h0: Tensor, c0: Tensor | None, h_mask: Tensor | None
                   ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """The forward buffers of the recurrent state: Hs (T+1, B, H) with Hs[0] = h_0; HM (T, B, H)
    for h_{t-1} * h_mask (recurrent dropout only); with a memory cell (``c0`` given) C (T+1, B, H)
    with C[0] = c_0 and TC (T, B, H) for tanh(c_t)."""
    T, B, H = x.shape[0], x.shape[1], h0.shape[-1]
    Hs = x.new_empty(T + 1, B, H)
    Hs[0] = h0
    HM = x.new_empty(T, B, H) if h_mask is not None else None
    C = TC = None
    if c0 is not None:
        C = x.new_empty(T + 1, B, H)
        C[0] = c0
        TC = x.new_empty(T, B, H)
    return Hs, HM, C, TC


def _factored(cell, x, state, lengths, h_mask):
    memory = cell.n_blocks == 4
    h0 = state[0]
    c0 = state[1] if memory else None
    out, hn, cn = _FactoredRecurrence.apply(memory, cell.factor_size, x, h0, c0, cell.weight_ih,
                                            cell.weight_mh, cell.weight_hm, cell.bias, h_mask,
                                            lengths)
    return out, ((hn, cn) if memory else (hn,))


class _FactoredRecurrence(torch.autograd.Function):
    """mRNN (``memory=False``) and mLSTM (``memory=True``; blocks i, f, o, u).

    Forward buffers: ``A`` (T, B, F) = W_mx x_t; ``Z`` (T, B, n*H) = W_x x_t + b, then
    + W_hm m_t, then (mLSTM) the activations in place; ``P`` (T, B, F) = W_mh h'_{t-1};
    ``M`` (T, B, F) = m_t; ``Hs`` (T+1, B, H) with Hs[0] = h_0; ``HM`` (T, B, H) =
    h_{t-1} * h_mask with recurrent dropout; mLSTM: ``C`` (T+1, B, H), ``TC`` = tanh(c_t).
    On CPU in float32 / float64 both loops are one call each into the native kernel
    (``factored_fwd`` / ``factored_bwd`` of :data:`_C_SECOND_ORDER`; ``ctx.native``), which
    fill the same buffers; otherwise the PyTorch loops below.
    """

    @staticmethod
    def forward(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths):
        T, B, I = x.shape
        H = h0.shape[-1]
        nH = w_hm.shape[0]
        x2 = x.reshape(T * B, I)
        A = torch.mm(x2, w_ih[:F].t()).view(T, B, F)
        Z = torch.addmm(bias, x2, w_ih[F:].t()).view(T, B, nH)
        P = x.new_empty(T, B, F)
        M = x.new_empty(T, B, F)
        Hs, HM, C, TC = _state_buffers(x, h0, c0 if memory else None, h_mask)
        ctx.native = lib = _native_for(x)
        if lib is not None:  # the whole loop in one C call (factored_fwd in _C_SECOND_ORDER)
            if h_mask is not None:
                h_mask = h_mask.expand(B, H).contiguous()
            w_mh, w_hm = w_mh.contiguous(), w_hm.contiguous()
            fn = lib.factored_fwd_f if x.dtype == torch.float32 else lib.factored_fwd_d
            fn(int(memory), T, B, H, F, _fused.PAR_MIN, _ptr(A), _ptr(Z), _ptr(P), _ptr(M),
               _ptr(Hs), _ptr(HM), _ptr(C), _ptr(TC), _ptr(w_mh), _ptr(w_hm), _ptr(h_mask))
            return _FactoredRecurrence._finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask,
                                               lengths, A, Z, P, M, Hs, HM, C, TC)
        hs, as_, ps, ms, zs = Hs.unbind(0), A.unbind(0), P.unbind(0), M.unbind(0), Z.unbind(0)
        hms = HM.unbind(0) if HM is not None else None
        # the per-step products: h' W_mh^T and m W_hm^T (packed, or row-major (in, out) copies)
        mh, hm = _StepProduct(w_mh.t(), B, T), _StepProduct(w_hm.t(), B, T)
        if not memory:
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                torch.mul(as_[t], mh(hp, ps[t]), out=ms[t])
                torch.tanh(hm.add_to(zs[t], ms[t]), out=hs[t + 1])
        else:
            cs, tcs = C.unbind(0), TC.unbind(0)
            Z4 = Z.view(T, B, 4, H)
            zg = Z[:, :, :3 * H].unbind(0)
            zi, zf, zo, zu = (Z4[:, :, k].unbind(0) for k in range(4))
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                torch.mul(as_[t], mh(hp, ps[t]), out=ms[t])
                hm.add_to(zs[t], ms[t])
                zg[t].sigmoid_()  # i, f, o
                zu[t].tanh_()  # u
                c = torch.mul(zf[t], cs[t], out=cs[t + 1])
                c.addcmul_(zi[t], zu[t])  # c_t = f_t * c_{t-1} + i_t * u_t
                torch.mul(zo[t], torch.tanh(c, out=tcs[t]), out=hs[t + 1])  # h_t = o_t * tanh(c_t)
        return _FactoredRecurrence._finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask,
                                           lengths, A, Z, P, M, Hs, HM, C, TC)

    @staticmethod
    def _finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask, lengths, A, Z, P, M, Hs, HM,
                C, TC):
        """The outputs (zero at padding) and final states; saves what the backward reads."""
        out, hn, cn = _outputs(Hs, C, lengths)
        ctx.memory, ctx.F = memory, F
        ctx.save_for_backward(x, w_ih, w_mh, w_hm, bias, h_mask, lengths, A, Z, P, M, Hs, HM, C, TC)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        x, w_ih, w_mh, w_hm, _bias, h_mask, lengths, A, Z, P, M, Hs, HM, C, TC = ctx.saved_tensors
        memory, F = ctx.memory, ctx.F
        T, B, _ = x.shape
        H = Hs.shape[-1]
        nH = Z.shape[-1]
        DH, dh0_direct = _state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        dXP = A.new_empty(T, B, F + nH)  # [dA, dZ]: the gradient of the input-side products
        DP = A.new_empty(T, B, F)
        # mLSTM: dc_t from the final state (the carry from t+1 is added in place)
        DC, dc0_direct = (_state_grads_into_steps(None, dcn, lengths, C[1:]) if memory
                          else (None, None))
        if ctx.native is not None:  # the reverse loop in one C call (factored_bwd); it also
            # writes dA = dM * P, so dM needs no buffer
            dh0 = A.new_empty(B, H)
            dc0 = A.new_empty(B, H) if memory else None
            tmp = A.new_empty(B * F + B * H)
            fn = ctx.native.factored_bwd_f if A.dtype == torch.float32 else ctx.native.factored_bwd_d
            fn(int(memory), T, B, H, F, _fused.PAR_MIN, _ptr(A), _ptr(P), _ptr(Z), _ptr(C),
               _ptr(TC), _ptr(Hs), _ptr(DH), _ptr(DC), _ptr(dXP), _ptr(DP), _ptr(dh0), _ptr(dc0),
               _ptr(w_mh), _ptr(w_hm), _ptr(h_mask), _ptr(tmp))
            return _FactoredRecurrence._weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP,
                                                     _add(dh0, dh0_direct), _add(dc0, dc0_direct))
        dZ = dXP[:, :, F:]
        DM = A.new_empty(T, B, F)
        dhs, dzs, dms, dps = DH.unbind(0), dZ.unbind(0), DM.unbind(0), DP.unbind(0)
        as_ = A.unbind(0)
        hm, mh = _StepProduct(w_hm, B, T), _StepProduct(w_mh, B, T)  # dM = dZ W_hm, dh' = dP W_mh
        dc0 = None

        def through_m(t: int) -> None:
            """dP_t = (dZ_t W_hm) * A_t, then dh_{t-1} += dP_t W_mh (times h_mask)."""
            torch.mul(hm(dzs[t], dms[t]), as_[t], out=dps[t])
            if t > 0:
                if h_mask is None:
                    mh.add_to(dhs[t - 1], dps[t])
                else:
                    dhs[t - 1].addcmul_(mh(dps[t]), h_mask)

        if not memory:
            Kz = Hs[1:] * Hs[1:]
            Kz.neg_().add_(1)  # tanh' = 1 - h^2
            kzs = Kz.unbind(0)
            for t in range(T - 1, -1, -1):
                torch.mul(dhs[t], kzs[t], out=dzs[t])
                through_m(t)
        else:
            Z4 = Z.view(T, B, 4, H)  # activations i, f, o, u
            K, Kc = _lstm_factors(Z4, C, TC)
            dcs, kcs, ks, kos = DC.unbind(0), Kc.unbind(0), K.unbind(0), K[:, :, 2].unbind(0)
            dZ4 = dZ.view(T, B, 4, H)
            dz4s, dzos = dZ4.unbind(0), dZ4[:, :, 2].unbind(0)
            fs = Z4[:, :, 1].unbind(0)
            for t in range(T - 1, -1, -1):
                dh = dhs[t]
                dc = dcs[t].addcmul_(dh, kcs[t])
                torch.mul(ks[t], dc.unsqueeze(1), out=dz4s[t])
                torch.mul(kos[t], dh, out=dzos[t])
                through_m(t)
                if t > 0:
                    dcs[t - 1].addcmul_(dc, fs[t])
            dc0 = _add(dcs[0] * fs[0], dc0_direct)
        dh0 = mh(dps[0])
        if h_mask is not None:
            dh0.mul_(h_mask)
        dh0 = _add(dh0, dh0_direct)
        torch.mul(DM, P, out=dXP[:, :, :F])  # dA = dM * P
        return _FactoredRecurrence._weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP, dh0, dc0)

    @staticmethod
    def _weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP, dh0, dc0):
        """Input and weight gradients: one matrix product each over all steps."""
        memory, F = ctx.memory, ctx.F
        T, B, I = x.shape
        H = Hs.shape[-1]
        nH = w_hm.shape[0]
        need = ctx.needs_input_grad
        dXP2 = dXP.view(T * B, F + nH)
        dx = torch.mm(dXP2, w_ih).view(T, B, I) if need[2] else None
        dw_ih = torch.mm(dXP2.t(), x.reshape(T * B, I)) if need[5] else None
        dw_mh = None
        if need[6]:
            Hprev = Hs[:-1] if HM is None else HM
            dw_mh = torch.mm(DP.view(T * B, F).t(), Hprev.reshape(T * B, H))
        dw_hm = torch.mm(dXP2[:, F:].t(), M.view(T * B, F)) if need[7] else None
        db = dXP2[:, F:].sum(0) if need[8] else None
        return (None, None, dx, dh0 if need[3] else None, dc0 if memory and need[4] else None,
                dw_ih, dw_mh, dw_hm, db, None, None)


# ---------------------------------------------------------------------------------
# mmRNN and mmLSTM: a key vector mixes K choice matrices
# ---------------------------------------------------------------------------------

def _groups(Ks: tuple[int, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """Blocks processed together: (first block, number of blocks, K, key offset).

    Equal K_g: one group of all blocks (one softmax, one batched product per step);
    otherwise one group per block.
    """
    if len(set(Ks)) == 1:
        return ((0, len(Ks), Ks[0], 0),)
    return tuple((b, 1, k, sum(Ks[:b])) for b, k in enumerate(Ks))


def _softmax(logits: Tensor, out: Tensor, contiguous: bool) -> None:
    """out = softmax(logits, -1); ``contiguous``: ``out`` is a contiguous tensor (the
    ``out=`` variants write contiguous results, so a strided ``out`` gets a copy)."""
    if contiguous:
        torch.ops.aten._softmax.out(logits, -1, False, out=out)
    else:
        out.copy_(torch._softmax(logits, -1, False))


def _softmax_backward(grad: Tensor, v: Tensor, out: Tensor, contiguous: bool) -> None:
    """out = v * (grad - sum(v * grad)): the gradient of the softmax's input."""
    if contiguous:
        torch.ops.aten._softmax_backward_data.out(grad, v, -1, v.dtype, grad_input=out)
    else:
        out.copy_(torch._softmax_backward_data(grad, v, -1, v.dtype))


def _cols(b0: int, nb: int, k: int, ko: int, H: int) -> tuple[slice, slice, slice]:
    """A group's columns in the keys (K), the pre-activations (n*H) and R (K*H)."""
    return slice(ko, ko + nb * k), slice(b0 * H, (b0 + nb) * H), slice(ko * H, (ko + nb * k) * H)


def _per_step(buf: Tensor, cols: slice, *shape: int) -> tuple[Tensor, ...]:
    """``buf[:, :, cols]`` (T, B, m) viewed as (T, *shape), split into per-step views.

    (Only the last dimension is split, or ``cols`` covers whole contiguous rows, so
    this is always a view.)"""
    part = buf[:, :, cols]
    return part.view(part.shape[0], *shape).unbind(0)


def _multi_matrix(cell, x, state, lengths, h_mask):
    memory = cell._n_plain == 2
    np_ = cell._n_plain
    h0 = state[0]
    c0 = state[1] if memory else None
    keys = state[np_:]
    Ks = tuple(cell.num_matrices[g] for g in cell.blocks)
    v0 = torch.cat(keys, dim=-1) if len(keys) > 1 else keys[0]
    bd = torch.block_diag(*cell.key_weights) if len(Ks) > 1 else cell.key_weights[0]
    out, hn, cn, vn = _MultiMatrixRecurrence.apply(memory, Ks, x, h0, c0, v0, cell.weight_ih,
                                                   cell.weight_hh, bd, cell.bias, h_mask, lengths)
    new_keys = tuple(vn.split(list(Ks), dim=-1)) if len(Ks) > 1 else (vn,)
    return out, ((hn, cn) if memory else (hn,)) + new_keys


class _MultiMatrixRecurrence(torch.autograd.Function):
    """mmRNN (``memory=False``: one block) and mmLSTM (``memory=True``: blocks i, f, o, c).

    Forward buffers: ``XK`` (T, B, K): the key logits (x-columns, + bias, then the h- and
    v-columns added per step); ``V`` (T+1, B, K): the keys, V[0] = v_0; ``rs``: T tensors
    R_t (B, K*H), every W_g[j] h'_{t-1} (the per-step product's own output, kept rather
    than copied into a buffer); ``XP`` (T, B, n*H): W_g^hx x_t (+ bias), + the mixture,
    then the activations in place; ``Hs`` (T+1, B, H); ``HM`` (T, B, H) with recurrent
    dropout; mmLSTM: ``C`` (T+1, B, H), ``TC`` = tanh(c_t).

    Backward buffers: ``DPRE`` (T, B, n*H): d pre-activations; ``DV`` (T, B, K): dv_t (the
    final keys' gradient, then the carry from t+1, then R_t . d pre added); ``DL``
    (T, B, K): d logits; ``dR`` (T, B, K + K*H): [d logits, dR_t], the gradient of
    h'_{t-1} W_hh^T, so that dh'_{t-1} is ONE product with W_hh per step and dW_hh ONE
    product over all steps.

    On CPU in float32 / float64 both loops are one call each into the native kernel
    (``multi_fwd`` / ``multi_bwd`` of :data:`_C_SECOND_ORDER`; ``ctx.native``), which fill
    the same buffers except ``rs``: one (T, B, K + K*H) buffer, [h' W_key^T, R_t] per step.
    """

    @staticmethod
    def forward(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask, lengths):
        T, B, I = x.shape
        H = h0.shape[-1]
        n, Kt = len(Ks), sum(Ks)
        groups = _groups(Ks)
        x2 = x.reshape(T * B, I)
        if bias is None:
            XK = torch.mm(x2, w_ih[:Kt].t()).view(T, B, Kt)
            XP = torch.mm(x2, w_ih[Kt:].t()).view(T, B, n * H)
        else:
            XK = torch.addmm(bias[:Kt], x2, w_ih[:Kt].t()).view(T, B, Kt)
            XP = torch.addmm(bias[Kt:], x2, w_ih[Kt:].t()).view(T, B, n * H)
        V = x.new_empty(T + 1, B, Kt)
        V[0] = v0
        Hs, HM, C, TC = _state_buffers(x, h0, c0 if memory else None, h_mask)
        ctx.native = lib = _native_for(x)
        if lib is not None:  # the whole loop in one C call (multi_fwd in _C_SECOND_ORDER)
            R = x.new_empty(T, B, Kt + Kt * H)  # h'_{t-1} W_hh^T: key h-columns, every W_g[j] h'
            if h_mask is not None:
                h_mask = h_mask.expand(B, H).contiguous()
            w_hh, bd = w_hh.contiguous(), bd.contiguous()
            fn = lib.multi_fwd_f if x.dtype == torch.float32 else lib.multi_fwd_d
            fn(int(memory), n, (ctypes.c_int * n)(*Ks), T, B, H, _fused.PAR_MIN, _ptr(XK), _ptr(V),
               _ptr(R), _ptr(XP), _ptr(Hs), _ptr(HM), _ptr(C), _ptr(TC), _ptr(w_hh), _ptr(bd),
               _ptr(h_mask))
            return _MultiMatrixRecurrence._finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask,
                                                  lengths, V, XP, Hs, HM, C, TC, [R])
        hs, vs, xks, xps = Hs.unbind(0), V.unbind(0), XK.unbind(0), XP.unbind(0)
        rs = []  # R_t (B, K*H): every W_g[j] h'_{t-1}, one tensor per step
        hms = HM.unbind(0) if HM is not None else None
        w_key_t, bd_t = w_hh[:Kt].t(), bd.t()  # small: the key logits' h- and v-columns
        choice = _StepProduct(w_hh[Kt:].t(), B, T)  # the choice matrices: the big per-step product
        if memory:
            cs, tcs = C.unbind(0), TC.unbind(0)
            XP4 = XP.view(T, B, 4, H)
            zg, zc = XP[:, :, :3 * H].unbind(0), XP[:, :, 3 * H:].unbind(0)
            zi, zf, zo = (XP4[:, :, k].unbind(0) for k in range(3))
        one = len(groups) == 1  # the softmax outputs are whole rows (contiguous)
        Vn = V[1:]
        # per group, the per-step views every step needs (made once, not per step)
        gviews = []
        for b0, nb, k, ko in groups:
            kk, hc, rc = _cols(b0, nb, k, ko, H)
            gviews.append((_per_step(XK, kk, B, nb, k), _per_step(Vn, kk, B, nb, k),
                           _per_step(Vn, kk, B * nb, 1, k), _per_step(XP, hc, B * nb, 1, H),
                           (rc, B * nb, k, H)))
        for t in range(T):
            hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
            xks[t].addmm_(hp, w_key_t).addmm_(vs[t], bd_t)  # eqs 6 / 9-15: the key logits
            r = choice(hp)  # every W_g[j] h'_{t-1}
            rs.append(r)
            for lg3, v3, vb, preb, (rc, *rshape) in gviews:
                _softmax(lg3[t], v3[t], one)
                # eqs 7 / 10-16: pre_g += sum_j v_g[j] (W_g[j] h'), one batched product
                preb[t].baddbmm_(vb[t], r[:, rc].view(rshape))
            pre = xps[t]
            if not memory:
                torch.tanh(pre, out=hs[t + 1])  # eq 8
            else:
                zg[t].sigmoid_()  # eqs 17-19
                zc[t].tanh_()  # eq 20
                c = torch.mul(zf[t], cs[t], out=cs[t + 1])
                c.addcmul_(zi[t], zc[t])  # eq 21
                torch.mul(zo[t], torch.tanh(c, out=tcs[t]), out=hs[t + 1])  # eq 22
        return _MultiMatrixRecurrence._finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask,
                                              lengths, V, XP, Hs, HM, C, TC, rs)

    @staticmethod
    def _finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask, lengths, V, XP, Hs, HM, C, TC,
                rs):
        """The outputs (zero at padding) and final states; saves what the backward reads
        (``rs``: the T tensors R_t, or with the native loops ONE (T, B, K + K*H) buffer)."""
        out, hn, cn = _outputs(Hs, C, lengths)
        vn = _final(V, lengths)
        ctx.memory, ctx.Ks = memory, Ks
        ctx.save_for_backward(x, w_ih, w_hh, bd, bias, h_mask, lengths, V, XP, Hs, HM, C, TC, *rs)
        return out, hn, cn, vn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn, dvn):
        x, w_ih, w_hh, bd, bias, h_mask, lengths, V, XP, Hs, HM, C, TC, *rs = ctx.saved_tensors
        memory, Ks = ctx.memory, ctx.Ks
        T, B, _ = x.shape
        H = Hs.shape[-1]
        n, Kt = len(Ks), sum(Ks)
        groups = _groups(Ks)
        DH, dh0_direct = _state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        DV, dv0_direct = _state_grads_into_steps(None, dvn, lengths, V[1:])  # dv_t (+ carry)
        DPRE = XP.new_empty(T, B, n * H)  # gradient of the pre-activations (= of W_g^hx x_t)
        dR = XP.new_empty(T, B, Kt + Kt * H)  # gradient of h' W_hh^T: [d logits, d R]
        DL = XP.new_empty(T, B, Kt)  # d logits (contiguous; copied into dR per step)
        # mmLSTM: dc_t from the final state (the carry from t+1 is added in place)
        DC, dc0_direct = (_state_grads_into_steps(None, dcn, lengths, C[1:]) if memory
                          else (None, None))
        if ctx.native is not None:  # the reverse loop in one C call (multi_bwd)
            dh0, dv0 = XP.new_empty(B, H), XP.new_empty(B, Kt)
            dc0 = XP.new_empty(B, H) if memory else None
            tmp = XP.new_empty(B * H)
            fn = ctx.native.multi_bwd_f if XP.dtype == torch.float32 else ctx.native.multi_bwd_d
            fn(int(memory), n, (ctypes.c_int * n)(*Ks), T, B, H, _fused.PAR_MIN, _ptr(V),
               _ptr(rs[0]), _ptr(XP), _ptr(C), _ptr(TC), _ptr(Hs), _ptr(DH), _ptr(DV), _ptr(DC),
               _ptr(DPRE), _ptr(dR), _ptr(DL), _ptr(dh0), _ptr(dv0), _ptr(dc0), _ptr(w_hh),
               _ptr(bd), _ptr(h_mask), _ptr(tmp))
            return _MultiMatrixRecurrence._weight_grads(
                ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR, DL, _add(dh0, dh0_direct),
                _add(dv0, dv0_direct), _add(dc0, dc0_direct))
        dhs, dvs, dpres = DH.unbind(0), DV.unbind(0), DPRE.unbind(0)
        dRs, dls = dR.unbind(0), DL.unbind(0)
        one = len(groups) == 1
        rec = _StepProduct(w_hh, B, T)  # dh' = [d logits, dR] W_hh
        if not memory:
            Kz = Hs[1:] * Hs[1:]
            Kz.neg_().add_(1)
            kzs = Kz.unbind(0)
        else:
            XP4 = XP.view(T, B, 4, H)  # activations i, f, o, c^
            K, Kc = _lstm_factors(XP4, C, TC)
            dcs, kcs, ks, kos = DC.unbind(0), Kc.unbind(0), K.unbind(0), K[:, :, 2].unbind(0)
            DPRE4 = DPRE.view(T, B, 4, H)
            dp4s, dpos = DPRE4.unbind(0), DPRE4[:, :, 2].unbind(0)
            fs = XP4[:, :, 1].unbind(0)
        Vn = V[1:]
        gviews = []
        for b0, nb, k, ko in groups:
            kk, hc, rc = _cols(b0, nb, k, ko, H)
            rcd = slice(Kt + rc.start, Kt + rc.stop)
            gviews.append((_per_step(DV, kk, B * nb, k, 1),
                           [r[:, rc].view(B * nb, k, H) for r in rs],
                           _per_step(DPRE, hc, B * nb, H, 1), _per_step(Vn, kk, B, nb, k, 1),
                           _per_step(DPRE, hc, B, nb, 1, H), _per_step(dR, rcd, B, nb, k, H),
                           _per_step(DV, kk, B, nb, k), _per_step(Vn, kk, B, nb, k),
                           _per_step(DL, kk, B, nb, k)))
        dRk = dR[:, :, :Kt].unbind(0)
        for t in range(T - 1, -1, -1):
            dh = dhs[t]
            if not memory:
                torch.mul(dh, kzs[t], out=dpres[t])
            else:
                dc = dcs[t].addcmul_(dh, kcs[t])
                torch.mul(ks[t], dc.unsqueeze(1), out=dp4s[t])
                torch.mul(kos[t], dh, out=dpos[t])
            for dvb, rb, dpb, v4, dp4, drc, dv3, v3, dl3 in gviews:
                dvb[t].baddbmm_(rb[t], dpb[t])  # dv_g[j] += (W_g[j] h') . d pre_g
                torch.mul(v4[t], dp4[t], out=drc[t])  # d (W_g[j] h') = v_g[j] d pre_g
                _softmax_backward(dv3[t], v3[t], dl3[t], one)
            dr = dRs[t]
            dRk[t].copy_(dls[t])
            if t > 0:
                if h_mask is None:
                    rec.add_to(dhs[t - 1], dr)
                else:
                    dhs[t - 1].addcmul_(rec(dr), h_mask)
                dvs[t - 1].addmm_(dls[t], bd)  # the key's own recurrence
                if memory:
                    dcs[t - 1].addcmul_(dc, fs[t])
        dh0 = rec(dRs[0])
        if h_mask is not None:
            dh0.mul_(h_mask)
        dh0 = _add(dh0, dh0_direct)
        dv0 = _add(torch.mm(dls[0], bd), dv0_direct)
        dc0 = _add(dcs[0] * fs[0], dc0_direct) if memory else None
        return _MultiMatrixRecurrence._weight_grads(ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR,
                                                    DL, dh0, dv0, dc0)

    @staticmethod
    def _weight_grads(ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR, DL, dh0, dv0, dc0):
        """Input and weight gradients: one matrix product each over all steps."""
        memory, Ks = ctx.memory, ctx.Ks
        T, B, I = x.shape
        H = Hs.shape[-1]
        n, Kt = len(Ks), sum(Ks)
        need = ctx.needs_input_grad
        dR2 = dR.view(T * B, Kt + Kt * H)
        dL2 = DL.view(T * B, Kt)  # d logits = gradient of the key projections' x-columns
        DPRE2 = DPRE.view(T * B, n * H)
        x2 = x.reshape(T * B, I)
        dx = dw_ih = db = dw_hh = dbd = None
        if need[2]:
            dx = torch.mm(DPRE2, w_ih[Kt:])
            dx.addmm_(dL2, w_ih[:Kt])
            dx = dx.view(T, B, I)
        if need[6]:
            dw_ih = torch.cat([torch.mm(dL2.t(), x2), torch.mm(DPRE2.t(), x2)])
        if need[7]:
            Hprev = Hs[:-1] if HM is None else HM
            dw_hh = torch.mm(dR2.t(), Hprev.reshape(T * B, H))
        if need[8]:
            dbd = torch.mm(dL2.t(), V[:-1].reshape(T * B, Kt))
        if bias is not None and need[9]:
            db = torch.cat([dL2.sum(0), DPRE2.sum(0)])
        return (None, None, dx, dh0 if need[3] else None, dc0 if memory and need[4] else None,
                dv0 if need[5] else None, dw_ih, dw_hh, dbd, db, None, None)


# ---------------------------------------------------------------------------------
# dyck-rnn: h_t = (g_t W_1 + (1 - g_t) W_2) h_{t-1} + g_t W^hx x_t
# ---------------------------------------------------------------------------------

def _dyck(cell, x, state, lengths, h_mask):
    xp = cell.project_inputs(x)  # [g_t, g_t W^hx x_t] for all steps (ordinary autograd)
    shifts = torch.cat([cell.shift_push, cell.shift_pop])  # [W_1; W_2] (2H, H), fixed
    out, hn = _DyckRecurrence.apply(xp[..., :1], xp[..., 1:], state[0], shifts, h_mask, lengths)
    return out, (hn,)


class _DyckRecurrence(torch.autograd.Function):
    """Eqs 4-5 given g_t (T, B, 1) and u_t = g_t W^hx x_t (T, B, H).

    Buffers: ``S`` (T, B, 2H) = [W_1 h'; W_2 h'] per step; ``Hs`` (T+1, B, H).
    """

    @staticmethod
    def forward(ctx, g, u, h0, shifts, h_mask, lengths):
        T, B, H = u.shape
        G1 = 1 - g
        S = u.new_empty(T, B, 2 * H)
        Hs = u.new_empty(T + 1, B, H)
        Hs[0] = h0
        hs, ss, gs, g1s, us = Hs.unbind(0), S.unbind(0), g.unbind(0), G1.unbind(0), u.unbind(0)
        sh_t = shifts.t()
        tmp = u.new_empty(B, H) if h_mask is not None else None
        for t in range(T):
            hp = hs[t] if h_mask is None else torch.mul(hs[t], h_mask, out=tmp)
            s = torch.mm(hp, sh_t, out=ss[t])
            h = torch.addcmul(us[t], gs[t], s[:, :H], out=hs[t + 1])  # g W_1 h' + g W^hx x
            h.addcmul_(g1s[t], s[:, H:])  # + (1 - g) W_2 h'
        out = _masked_outputs(Hs[1:], lengths)
        hn = _final(Hs, lengths)
        ctx.save_for_backward(g, shifts, h_mask, lengths, S)
        return out, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        g, shifts, h_mask, lengths, S = ctx.saved_tensors
        T, B, H2 = S.shape
        H = H2 // 2
        DH, dh0_direct = _state_grads_into_steps(dout, dhn, lengths, S[..., :H])
        G2 = torch.cat([g, 1 - g], dim=-1).unsqueeze(-1)  # (T, B, 2, 1): [g, 1 - g]
        dS = S.new_empty(T, B, 2, H)
        dhs, dss, g2s = DH.unbind(0), dS.unbind(0), G2.unbind(0)
        for t in range(T - 1, -1, -1):
            torch.mul(g2s[t], dhs[t].unsqueeze(1), out=dss[t])
            if t > 0:
                if h_mask is None:
                    dhs[t - 1].addmm_(dss[t].view(B, 2 * H), shifts)
                else:
                    dhs[t - 1].addcmul_(torch.mm(dss[t].view(B, 2 * H), shifts), h_mask)
        dh0 = torch.mm(dss[0].view(B, 2 * H), shifts)
        if h_mask is not None:
            dh0.mul_(h_mask)
        dh0 = _add(dh0, dh0_direct)
        need = ctx.needs_input_grad
        dg = (DH * (S[..., :H] - S[..., H:])).sum(-1, keepdim=True) if need[0] else None
        return dg, DH if need[1] else None, dh0 if need[2] else None, None, None, None
