"""The fast paths of mRNN and mLSTM (``lstmablate/cells/multiplicative.py``): the factored,
input-dependent transition m_t = (W_mx x_t) * (W_mh h_{t-1}) (Sutskever et al. 2011;
Krause et al. 2016).

Up front: A = x W_mx^T (T, B, F) and Z = x W_x^T + b (T, B, n*H).  Per step:
P_t = h'_{t-1} W_mh^T, M_t = A_t * P_t, Z_t += M_t W_hm^T, then tanh (mRNN) or the LSTM
element-wise work (mLSTM; blocks i, f, o, u).  Backward per step: dZ_t from dh_t (and dc_t),
dM_t = dZ_t W_hm, dP_t = dM_t * A_t, dh_{t-1} += dP_t W_mh.  After the loop dA = dM * P
and dW_ih = [dA, dZ]^T X, dW_mh = dP^T H', dW_hm = dZ^T M, dX = [dA, dZ] W_ih.  Native
(``second_order.c``): the same buffers; each loop is one C call (per step the two
products through MKL's packed GEMM in float32, sgemm_/dgemm_ otherwise, and each piece of
element-wise work one fused pass; the backward writes dA_t = dM_t * P_t in the loop), and
the weight gradients stay here.  Both run padding-free (``common/sequences.py``, ``Steps``).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import gemm, native
from ..common.sequences import Steps
from ..interface import KernelPath, register
from . import shared
from .shared import SecondOrderKernels, factored_weight_grads, lstm_factors, state_buffers
from .step_products import StepProduct


class FactoredKernels(SecondOrderKernels):
    name = "factored"
    reads = ("hidden_size", "factor_size", "has_memory_cell", "weight_ih", "weight_mh",
             "weight_hm", "bias")
    cases = (("mrnn", {}), ("mrnn", {"factor_size": 3}), ("mlstm", {}),
             ("mlstm", {"factor_size": 6, "forget_bias": 1.0}))

    def run(self, path, v, x, state, lengths, h_mask):
        memory = v.has_memory_cell
        h0 = state[0]
        c0 = state[1] if memory else None
        args = (memory, v.factor_size, x, h0, c0, v.weight_ih, v.weight_mh, v.weight_hm, v.bias,
                h_mask, lengths)
        if path is KernelPath.TRITON_RECURRENT:
            from .triton_kernels import TritonFactored

            out, hn, cn = TritonFactored.apply(*args)
        elif path is KernelPath.RECURRENT:
            out, hn, cn = FactoredRecurrence.apply(*args)
        else:
            raise self.unknown(path)
        return out, ((hn, cn) if memory else (hn,))


KERNELS = register(FactoredKernels())


class FactoredRecurrence(torch.autograd.Function):
    """mRNN (``memory=False``) and mLSTM (``memory=True``; blocks i, f, o, u).

    Forward buffers, in the packed layout of the call's ``Steps`` (N real tokens): ``X``
    (N, I) the inputs; ``A`` (N, F) = W_mx x_t; ``Z`` (N, n*H) = W_x x_t + b, then + W_hm m_t,
    then (mLSTM) the activations in place; ``P`` (N, F) = W_mh h'_{t-1}; ``M`` (N, F) = m_t;
    ``Hs`` (B+N, H): the initial states, then h_t; ``HM`` (N, H) = h_{t-1} * h_mask with
    recurrent dropout; mLSTM: ``C`` (B+N, H) likewise, ``TC`` (N, H) = tanh(c_t).  On CPU in
    float32 / float64 both loops are one call each into the native kernel (``factored_fwd`` /
    ``factored_bwd`` of ``second_order.c``; ``ctx.native``), which fill the same buffers;
    otherwise the PyTorch loops below.
    """

    @staticmethod
    def forward(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths):
        T, B, _ = x.shape
        H = h0.shape[-1]
        S = Steps(T, B, lengths, x.device)
        X = S.pack(x)
        ctx.native = lib = shared.native_library(x)
        ctx.products = prod = gemm.for_call(lib, X, w_ih, any(ctx.needs_input_grad))
        A = prod.nt(X, w_ih[:F])
        Z = prod.linear(X, w_ih[F:], bias)
        P = x.new_empty(S.N, F)
        M = x.new_empty(S.N, F)
        Hs, HM, C, TC = state_buffers(S, h0, c0 if memory else None, h_mask)
        hm = S.sort(h_mask) if h_mask is not None else None
        if lib is not None:  # the whole loop in one C call (factored_fwd, second_order.c)
            lib.call("factored_fwd", x.dtype, memory=int(memory), T=S.T, B=B, off=S.off, H=H, F=F,
                     par_min=native.PAR_MIN, A=A, Z=Z, P=P, M=M, Hs=Hs, HM=HM, C=C, TC=TC,
                     w_mh=w_mh.contiguous(), w_hm=w_hm.contiguous(), hmask=hm)
        else:
            FactoredRecurrence._forward_loop(memory, S, A, Z, P, M, Hs, HM, C, TC, w_mh, w_hm, hm)
        ctx.memory, ctx.F, ctx.steps = memory, F, S
        ctx.save_for_backward(X, w_ih, w_mh, w_hm, hm, A, Z, P, M, Hs, HM, C, TC)
        return S.unpack(Hs[B:]), S.final(Hs), S.final(C) if memory else None

    @staticmethod
    def _forward_loop(memory, S: Steps, A, Z, P, M, Hs, HM, C, TC, w_mh, w_hm, hm):
        """The forward loop in PyTorch operations (any device)."""
        h_in, h_out = S.states_in(Hs), S.states_out(Hs)
        as_, ps, ms, zs = S.per_step(A), S.per_step(P), S.per_step(M), S.per_step(Z)
        hms = S.per_step(HM) if HM is not None else None
        # the per-step products: h' W_mh^T and m W_hm^T (packed, or row-major (in, out) copies)
        mh, hmp = StepProduct(w_mh.t(), S.B, S.T), StepProduct(w_hm.t(), S.B, S.T)

        def h_prev(t):
            return h_in[t] if hms is None else torch.mul(h_in[t], hm[:S.rows(t)], out=hms[t])
        if not memory:
            for t in range(S.T):
                torch.mul(as_[t], mh(h_prev(t), ps[t]), out=ms[t])  # m_t = (W_mx x_t) * (W_mh h')
                torch.tanh(hmp.add_to(zs[t], ms[t]), out=h_out[t])  # h_t = tanh(W_hm m_t + W_hx x_t + b)
            return
        c_in, c_out, tcs = S.states_in(C), S.states_out(C), S.per_step(TC)
        H = Hs.shape[-1]
        Z4 = Z.view(S.N, 4, H)
        zg = S.per_step(Z[:, :3 * H])
        zi, zf, zo, zu = (S.per_step(Z4[:, k]) for k in range(4))
        for t in range(S.T):
            torch.mul(as_[t], mh(h_prev(t), ps[t]), out=ms[t])  # m_t = (W_mx x_t) * (W_mh h')
            hmp.add_to(zs[t], ms[t])  # [i; f; o; u] = W_x x_t + W_hm m_t + b
            zg[t].sigmoid_()  # i, f, o
            zu[t].tanh_()  # u
            c = torch.mul(zf[t], c_in[t], out=c_out[t])
            c.addcmul_(zi[t], zu[t])  # c_t = f_t * c_{t-1} + i_t * u_t
            torch.mul(zo[t], torch.tanh(c, out=tcs[t]), out=h_out[t])  # h_t = o_t * tanh(c_t)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        X, w_ih, w_mh, w_hm, hm, A, Z, P, M, Hs, HM, C, TC = ctx.saved_tensors
        memory, F = ctx.memory, ctx.F
        S: Steps = ctx.steps
        B, H = S.B, Hs.shape[-1]
        nH = Z.shape[-1]
        DH, dh0_direct = S.grads(dout, dhn, Hs)
        dXP = A.new_empty(S.N, F + nH)  # [dA, dZ]: the gradient of the input-side products
        DP = A.new_empty(S.N, F)
        # mLSTM: dc_t from the final states (the carry from t+1 is added in place)
        DC, dc0_direct = S.grads(None, dcn, C) if memory else (None, None)
        if ctx.native is not None:  # the reverse loop in one C call (factored_bwd); it also
            # writes dA = dM * P, so dM needs no buffer
            dh0 = A.new_empty(B, H)
            dc0 = A.new_empty(B, H) if memory else None
            ctx.native.call("factored_bwd", A.dtype, memory=int(memory), T=S.T, B=B, off=S.off,
                            H=H, F=F, par_min=native.PAR_MIN, A=A, P=P, Z=Z, C=C, TC=TC, Hs=Hs,
                            DH=DH, DC=DC, dXP=dXP, DP=DP, dh0=dh0, dc0=dc0, w_mh=w_mh, w_hm=w_hm,
                            hmask=hm, tmp=A.new_empty(B * F + B * H))
        else:
            dh0, dc0 = FactoredRecurrence._backward_loop(memory, F, S, A, P, Z, C, TC, Hs, DH, DC,
                                                         dXP, DP, w_mh, w_hm, hm)
        dx, grads = factored_weight_grads(ctx.needs_input_grad, F, X, w_ih, w_hm, M,
                                          HM if HM is not None else S.prev(Hs), dXP, DP,
                                          ctx.products)
        return (None, None, None if dx is None else S.unpacked(dx),
                S.initial_grad(dh0, dh0_direct),
                S.initial_grad(dc0, dc0_direct) if memory else None, *grads, None, None)

    @staticmethod
    def _backward_loop(memory, F, S: Steps, A, P, Z, C, TC, Hs, DH, DC, dXP, DP, w_mh, w_hm, hm):
        """The backward loop in PyTorch operations: fills dXP and DP, adds the recurrent parts
        into DH (and DC); returns dh_0 and dc_0 (sorted)."""
        B, H = S.B, Hs.shape[-1]
        dZ = dXP[:, F:]
        DM = A.new_empty(S.N, F)
        dhs, dzs, dms, dps = S.per_step(DH), S.per_step(dZ), S.per_step(DM), S.per_step(DP)
        as_ = S.per_step(A)
        hmp, mh = StepProduct(w_hm, B, S.T), StepProduct(w_mh, B, S.T)  # dM = dZ W_hm, dh' = dP W_mh
        dh0 = A.new_zeros(B, H)
        dc0 = A.new_zeros(B, H) if memory else None

        def through_m(t: int) -> None:
            """dP_t = (dZ_t W_hm) * A_t, then dh_{t-1} += dP_t W_mh (times h_mask)."""
            n = S.rows(t)
            torch.mul(hmp(dzs[t], dms[t]), as_[t], out=dps[t])
            target = dhs[t - 1][:n] if t > 0 else dh0[:n]
            if hm is None:
                mh.add_to(target, dps[t])
            else:
                target.addcmul_(mh(dps[t]), hm[:n])

        if not memory:
            h_out = S.states_out(Hs)
            for t in range(S.T - 1, -1, -1):
                h = h_out[t]
                torch.mul(dhs[t], 1 - h * h, out=dzs[t])  # tanh' = 1 - h^2
                through_m(t)
        else:
            Z4 = Z.view(S.N, 4, H)  # activations i, f, o, u
            K, Kc = lstm_factors(Z4, S.prev(C), TC)
            dcs, kcs, ks, kos = (S.per_step(DC), S.per_step(Kc), S.per_step(K),
                                 S.per_step(K[:, 2]))
            dZ4 = dZ.view(S.N, 4, H)  # (a view: only the last dimension is split)
            dz4s, dzos = S.per_step(dZ4), S.per_step(dZ4[:, 2])
            fs = S.per_step(Z4[:, 1])
            for t in range(S.T - 1, -1, -1):
                dh = dhs[t]
                dc = dcs[t].addcmul_(dh, kcs[t])
                torch.mul(ks[t], dc.unsqueeze(1), out=dz4s[t])
                torch.mul(kos[t], dh, out=dzos[t])
                through_m(t)
                if t > 0:
                    dcs[t - 1][:S.rows(t)].addcmul_(dc, fs[t])
            if S.T:
                torch.mul(dcs[0], fs[0], out=dc0[:S.rows(0)])
        torch.mul(DM, P, out=dXP[:, :F])  # dA = dM * P
        return dh0, dc0
