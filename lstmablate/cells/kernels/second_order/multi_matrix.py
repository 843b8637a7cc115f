"""The fast paths of mmRNN and mmLSTM (``lstmablate/cells/multiplicative.py``; Renganathan
& Singh, "R&S", eqs 6-22): a key vector v_g per block chooses a mixture of K_g matrices,
W_g^hh_t = sum_j v_g,t[j] W_g[j].

The key recurrences of all blocks are one: v_{t-1} (B, K) is the concatenated keys and
``torch.block_diag`` of the ``key_weights`` (K x K) maps it to every block's logits in one
product (its gradient goes back to the blocks through ``block_diag``'s own autograd).  Up
front: the x-columns of all key projections (T, B, K) and all W_g^hx x_t (T, B, n*H).  Per
step: logits += h' W_key^T + v_{t-1} BD^T; a softmax per block (one call for all blocks
when the K_g are equal; eqs 6, 9, 11, 13, 15); R_t = h' W_choice^T (B, K*H): every
W_g[j] h'; the mixture sum_j v_g[j] W_g[j] h' (eqs 7, 10, 12, 14, 16) as ONE batched
product (B*n batches of 1 x K_g times K_g x H) added in place to the pre-activations; then
tanh (eq 8) or the LSTM work (eqs 17-22).  Backward per step: d pre-activations;
dv_t += R_t . d pre (a batched product); dR_t = v_t (x) d pre (an outer product written
straight into the gradient of the recurrent product); the softmax backward (one call); then
ONE product dh_{t-1} += [d logits, dR_t] W_hh and the key carry dv_{t-1} += d logits BD.
After the loop: dW_hh = [d logits, dR]^T H' (one product), dBD, dW_ih, dX.

Native (``second_order.c``): one C call per loop (``multi_fwd`` / ``multi_bwd``); per
step ONE product h' W_hh^T for the key h-columns and all choice matrices together (kept
whole, (T, B, K + K*H), for the backward), the tiny v_{t-1} BD^T, and per row the logits,
the softmaxes, the mixture and the activations in one pass; backward: per row d pre, dv_t,
dR_t and the softmax backward in one pass, then the two products dh_{t-1} += [d logits,
dR_t] W_hh and dv_{t-1} += d logits BD.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.sequences import add, final, outputs, state_grads_into_steps
from ..interface import KernelPath, register
from . import shared
from .shared import SecondOrderKernels, lstm_factors, multi_weight_grads, state_buffers
from .step_products import StepProduct


class MultiMatrixKernels(SecondOrderKernels):
    name = "multi_matrix"
    reads = ("hidden_size", "blocks", "num_matrices", "has_memory_cell", "key_weights",
             "weight_ih", "weight_hh", "bias")
    cases = (("mmrnn", {}), ("mmrnn", {"num_matrices": 3, "bias": True}), ("mmlstm", {}),
             ("mmlstm", {"forget_matrices": 2, "bias": True}),
             ("mmlstm", {"num_matrices": 2, "content_matrices": 3, "output_matrices": 1}))

    def run(self, path, v, x, state, lengths, h_mask):
        memory = v.has_memory_cell
        np_ = 2 if memory else 1  # state: h (, c), then one key per block
        h0 = state[0]
        c0 = state[1] if memory else None
        keys = state[np_:]
        Ks = tuple(v.num_matrices[g] for g in v.blocks)
        v0 = torch.cat(keys, dim=-1) if len(keys) > 1 else keys[0]
        bd = torch.block_diag(*v.key_weights) if len(Ks) > 1 else v.key_weights[0]
        args = (memory, Ks, x, h0, c0, v0, v.weight_ih, v.weight_hh, bd, v.bias, h_mask, lengths)
        if path is KernelPath.TRITON_RECURRENT:
            from .triton_kernels import TritonMultiMatrix

            out, hn, cn, vn = TritonMultiMatrix.apply(*args)
        elif path is KernelPath.RECURRENT:
            out, hn, cn, vn = MultiMatrixRecurrence.apply(*args)
        else:
            raise self.unknown(path)
        new_keys = tuple(vn.split(list(Ks), dim=-1)) if len(Ks) > 1 else (vn,)
        return out, ((hn, cn) if memory else (hn,)) + new_keys


KERNELS = register(MultiMatrixKernels())


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


class MultiMatrixRecurrence(torch.autograd.Function):
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
    (``multi_fwd`` / ``multi_bwd`` of ``second_order.c``; ``ctx.native``), which fill
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
        Hs, HM, C, TC = state_buffers(x, h0, c0 if memory else None, h_mask)
        ctx.native = lib = shared.native_library(x)
        if lib is not None:  # the whole loop in one C call (multi_fwd, second_order.c)
            R = x.new_empty(T, B, Kt + Kt * H)  # h'_{t-1} W_hh^T: key h-columns, every W_g[j] h'
            if h_mask is not None:
                h_mask = h_mask.expand(B, H).contiguous()
            w_hh, bd = w_hh.contiguous(), bd.contiguous()
            lib.call("multi_fwd", x.dtype, memory=int(memory), n=n, Ks=Ks, T=T, B=B, H=H,
                     par_min=native.PAR_MIN, XK=XK, V=V, R=R, XP=XP, Hs=Hs, HM=HM, C=C, TC=TC,
                     w_hh=w_hh, bd=bd, hmask=h_mask)
            return MultiMatrixRecurrence._finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask,
                                                  lengths, V, XP, Hs, HM, C, TC, [R])
        hs, vs, xks, xps = Hs.unbind(0), V.unbind(0), XK.unbind(0), XP.unbind(0)
        rs = []  # R_t (B, K*H): every W_g[j] h'_{t-1}, one tensor per step
        hms = HM.unbind(0) if HM is not None else None
        w_key_t, bd_t = w_hh[:Kt].t(), bd.t()  # small: the key logits' h- and v-columns
        choice = StepProduct(w_hh[Kt:].t(), B, T)  # the choice matrices: the big per-step product
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
        return MultiMatrixRecurrence._finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask,
                                              lengths, V, XP, Hs, HM, C, TC, rs)

    @staticmethod
    def _finish(ctx, memory, Ks, x, w_ih, w_hh, bd, bias, h_mask, lengths, V, XP, Hs, HM, C, TC,
                rs):
        """The outputs (zero at padding) and final states; saves what the backward reads
        (``rs``: the T tensors R_t, or with the native loops ONE (T, B, K + K*H) buffer)."""
        out, hn, cn = outputs(Hs, C, lengths)
        vn = final(V, lengths)
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
        DH, dh0_direct = state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        DV, dv0_direct = state_grads_into_steps(None, dvn, lengths, V[1:])  # dv_t (+ carry)
        DPRE = XP.new_empty(T, B, n * H)  # gradient of the pre-activations (= of W_g^hx x_t)
        dR = XP.new_empty(T, B, Kt + Kt * H)  # gradient of h' W_hh^T: [d logits, d R]
        DL = XP.new_empty(T, B, Kt)  # d logits (contiguous; copied into dR per step)
        # mmLSTM: dc_t from the final state (the carry from t+1 is added in place)
        DC, dc0_direct = (state_grads_into_steps(None, dcn, lengths, C[1:]) if memory
                          else (None, None))
        if ctx.native is not None:  # the reverse loop in one C call (multi_bwd)
            dh0, dv0 = XP.new_empty(B, H), XP.new_empty(B, Kt)
            dc0 = XP.new_empty(B, H) if memory else None
            tmp = XP.new_empty(B * H)
            ctx.native.call("multi_bwd", XP.dtype, memory=int(memory), n=n, Ks=Ks, T=T, B=B, H=H,
                            par_min=native.PAR_MIN, V=V, R=rs[0], XP=XP, C=C, TC=TC, Hs=Hs, DH=DH,
                            DV=DV, DC=DC, DPRE=DPRE, dR=dR, DL=DL, dh0=dh0, dv0=dv0, dc0=dc0,
                            w_hh=w_hh, bd=bd, hmask=h_mask, tmp=tmp)
            return multi_weight_grads(
                ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR, DL, add(dh0, dh0_direct),
                add(dv0, dv0_direct), add(dc0, dc0_direct))
        dhs, dvs, dpres = DH.unbind(0), DV.unbind(0), DPRE.unbind(0)
        dRs, dls = dR.unbind(0), DL.unbind(0)
        one = len(groups) == 1
        rec = StepProduct(w_hh, B, T)  # dh' = [d logits, dR] W_hh
        if not memory:
            Kz = Hs[1:] * Hs[1:]
            Kz.neg_().add_(1)
            kzs = Kz.unbind(0)
        else:
            XP4 = XP.view(T, B, 4, H)  # activations i, f, o, c^
            K, Kc = lstm_factors(XP4, C, TC)
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
        dh0 = add(dh0, dh0_direct)
        dv0 = add(torch.mm(dls[0], bd), dv0_direct)
        dc0 = add(dcs[0] * fs[0], dc0_direct) if memory else None
        return multi_weight_grads(ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR,
                                                    DL, dh0, dv0, dc0)
