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
the weight gradients stay here.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.sequences import add, outputs, state_grads_into_steps
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

    Forward buffers: ``A`` (T, B, F) = W_mx x_t; ``Z`` (T, B, n*H) = W_x x_t + b, then
    + W_hm m_t, then (mLSTM) the activations in place; ``P`` (T, B, F) = W_mh h'_{t-1};
    ``M`` (T, B, F) = m_t; ``Hs`` (T+1, B, H) with Hs[0] = h_0; ``HM`` (T, B, H) =
    h_{t-1} * h_mask with recurrent dropout; mLSTM: ``C`` (T+1, B, H), ``TC`` = tanh(c_t).
    On CPU in float32 / float64 both loops are one call each into the native kernel
    (``factored_fwd`` / ``factored_bwd`` of ``second_order.c``; ``ctx.native``), which
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
        Hs, HM, C, TC = state_buffers(x, h0, c0 if memory else None, h_mask)
        ctx.native = lib = shared.native_library(x)
        if lib is not None:  # the whole loop in one C call (factored_fwd, second_order.c)
            if h_mask is not None:
                h_mask = h_mask.expand(B, H).contiguous()
            w_mh, w_hm = w_mh.contiguous(), w_hm.contiguous()
            lib.call("factored_fwd", x.dtype, memory=int(memory), T=T, B=B, H=H, F=F,
                     par_min=native.PAR_MIN, A=A, Z=Z, P=P, M=M, Hs=Hs, HM=HM, C=C, TC=TC,
                     w_mh=w_mh, w_hm=w_hm, hmask=h_mask)
            return FactoredRecurrence._finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask,
                                               lengths, A, Z, P, M, Hs, HM, C, TC)
        hs, as_, ps, ms, zs = Hs.unbind(0), A.unbind(0), P.unbind(0), M.unbind(0), Z.unbind(0)
        hms = HM.unbind(0) if HM is not None else None
        # the per-step products: h' W_mh^T and m W_hm^T (packed, or row-major (in, out) copies)
        mh, hm = StepProduct(w_mh.t(), B, T), StepProduct(w_hm.t(), B, T)
        if not memory:
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                torch.mul(as_[t], mh(hp, ps[t]), out=ms[t])  # m_t = (W_mx x_t) * (W_mh h')
                torch.tanh(hm.add_to(zs[t], ms[t]), out=hs[t + 1])  # h_t = tanh(W_hm m_t + W_hx x_t + b)
        else:
            cs, tcs = C.unbind(0), TC.unbind(0)
            Z4 = Z.view(T, B, 4, H)
            zg = Z[:, :, :3 * H].unbind(0)
            zi, zf, zo, zu = (Z4[:, :, k].unbind(0) for k in range(4))
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                torch.mul(as_[t], mh(hp, ps[t]), out=ms[t])  # m_t = (W_mx x_t) * (W_mh h')
                hm.add_to(zs[t], ms[t])  # [i; f; o; u] = W_x x_t + W_hm m_t + b
                zg[t].sigmoid_()  # i, f, o
                zu[t].tanh_()  # u
                c = torch.mul(zf[t], cs[t], out=cs[t + 1])
                c.addcmul_(zi[t], zu[t])  # c_t = f_t * c_{t-1} + i_t * u_t
                torch.mul(zo[t], torch.tanh(c, out=tcs[t]), out=hs[t + 1])  # h_t = o_t * tanh(c_t)
        return FactoredRecurrence._finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask,
                                           lengths, A, Z, P, M, Hs, HM, C, TC)

    @staticmethod
    def _finish(ctx, memory, F, x, w_ih, w_mh, w_hm, bias, h_mask, lengths, A, Z, P, M, Hs, HM,
                C, TC):
        """The outputs (zero at padding) and final states; saves what the backward reads."""
        out, hn, cn = outputs(Hs, C, lengths)
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
        DH, dh0_direct = state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        dXP = A.new_empty(T, B, F + nH)  # [dA, dZ]: the gradient of the input-side products
        DP = A.new_empty(T, B, F)
        # mLSTM: dc_t from the final state (the carry from t+1 is added in place)
        DC, dc0_direct = (state_grads_into_steps(None, dcn, lengths, C[1:]) if memory
                          else (None, None))
        if ctx.native is not None:  # the reverse loop in one C call (factored_bwd); it also
            # writes dA = dM * P, so dM needs no buffer
            dh0 = A.new_empty(B, H)
            dc0 = A.new_empty(B, H) if memory else None
            tmp = A.new_empty(B * F + B * H)
            ctx.native.call("factored_bwd", A.dtype, memory=int(memory), T=T, B=B, H=H, F=F,
                            par_min=native.PAR_MIN, A=A, P=P, Z=Z, C=C, TC=TC, Hs=Hs, DH=DH,
                            DC=DC, dXP=dXP, DP=DP, dh0=dh0, dc0=dc0, w_mh=w_mh, w_hm=w_hm,
                            hmask=h_mask, tmp=tmp)
            return factored_weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP,
                                                     add(dh0, dh0_direct), add(dc0, dc0_direct))
        dZ = dXP[:, :, F:]
        DM = A.new_empty(T, B, F)
        dhs, dzs, dms, dps = DH.unbind(0), dZ.unbind(0), DM.unbind(0), DP.unbind(0)
        as_ = A.unbind(0)
        hm, mh = StepProduct(w_hm, B, T), StepProduct(w_mh, B, T)  # dM = dZ W_hm, dh' = dP W_mh
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
            K, Kc = lstm_factors(Z4, C, TC)
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
            dc0 = add(dcs[0] * fs[0], dc0_direct)
        dh0 = mh(dps[0])
        if h_mask is not None:
            dh0.mul_(h_mask)
        dh0 = add(dh0, dh0_direct)
        torch.mul(DM, P, out=dXP[:, :, :F])  # dA = dM * P
        return factored_weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP, dh0, dc0)
