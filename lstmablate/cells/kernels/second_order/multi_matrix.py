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

Both run padding-free (``common/sequences.py``, ``Steps``): step t runs only the sequences
still running, every buffer holds real tokens only.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import gemm, native
from ..common.sequences import Steps
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


def _per_step(S: Steps, buf: Tensor, cols: slice, *shape: int, times: int = 1
              ) -> list[Tensor]:
    """Step t's rows of ``buf[:, cols]`` (N, m), each viewed as (rows(t) * times, *shape).

    (Only the last dimension is split, or ``cols`` covers whole contiguous rows, so
    this is always a view.)"""
    part = buf[:, cols]
    return [p.view(p.shape[0] * times, *shape) for p in S.per_step(part)]


class MultiMatrixRecurrence(torch.autograd.Function):
    """mmRNN (``memory=False``: one block) and mmLSTM (``memory=True``: blocks i, f, o, c).

    Forward buffers, in the packed layout of the call's ``Steps`` (N real tokens): ``X`` (N, I)
    the inputs; ``XK`` (N, K): the key logits (x-columns, + bias, then the h- and v-columns
    added per step); ``V`` (B+N, K): the initial keys, then v_t of every step; ``rs``: per step
    R_t (rows, K*H), every W_g[j] h'_{t-1} (the per-step product's own output, kept rather than
    copied into a buffer); ``XP`` (N, n*H): W_g^hx x_t (+ bias), + the mixture, then the
    activations in place; ``Hs`` (B+N, H); ``HM`` (N, H) with recurrent dropout; mmLSTM:
    ``C`` (B+N, H), ``TC`` (N, H) = tanh(c_t).

    Backward buffers: ``DPRE`` (N, n*H): d pre-activations; ``DV`` (N, K): dv_t (the final
    keys' gradient, then the carry from t+1, then R_t . d pre added); ``DL`` (N, K): d logits;
    ``dR`` (N, K + K*H): [d logits, dR_t], the gradient of h'_{t-1} W_hh^T, so that dh'_{t-1}
    is ONE product with W_hh per step and dW_hh ONE product over all steps.

    On CPU in float32 / float64 both loops are one call each into the native kernel
    (``multi_fwd`` / ``multi_bwd`` of ``second_order.c``; ``ctx.native``), which fill
    the same buffers except ``rs``: one (N, K + K*H) buffer, [h' W_key^T, R_t] per step.
    """

    @staticmethod
    def forward(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask, lengths):
        T, B, _ = x.shape
        H = h0.shape[-1]
        n, Kt = len(Ks), sum(Ks)
        S = Steps(T, B, lengths, x.device)
        X = S.pack(x)
        ctx.native = lib = shared.native_library(x)
        ctx.products = P = gemm.for_call(lib, X, w_ih, any(ctx.needs_input_grad))
        XK = P.linear(X, w_ih[:Kt], None if bias is None else bias[:Kt])
        XP = P.linear(X, w_ih[Kt:], None if bias is None else bias[Kt:])
        V = S.state_buffer(v0)
        Hs, HM, C, TC = state_buffers(S, h0, c0 if memory else None, h_mask)
        hm = S.sort(h_mask) if h_mask is not None else None
        if lib is not None:  # the whole loop in one C call (multi_fwd, second_order.c)
            R = x.new_empty(S.N, Kt + Kt * H)  # h'_{t-1} W_hh^T: key h-columns, every W_g[j] h'
            w_hh, bd = w_hh.contiguous(), bd.contiguous()
            lib.call("multi_fwd", x.dtype, memory=int(memory), n=n, Ks=Ks, T=S.T, B=B, off=S.off,
                     H=H, par_min=native.PAR_MIN, XK=XK, V=V, R=R, XP=XP, Hs=Hs, HM=HM, C=C, TC=TC,
                     w_hh=w_hh, bd=bd, hmask=hm)
            rs = [R]
        else:
            rs = MultiMatrixRecurrence._forward_loop(memory, Ks, S, XK, V, XP, Hs, HM, C, TC,
                                                     w_hh, bd, hm)
        ctx.memory, ctx.Ks, ctx.steps = memory, Ks, S
        ctx.save_for_backward(X, w_ih, w_hh, bd, bias, hm, V, XP, Hs, HM, C, TC, *rs)
        return (S.unpack(Hs[B:]), S.final(Hs), S.final(C) if memory else None, S.final(V))

    @staticmethod
    def _forward_loop(memory, Ks, S: Steps, XK, V, XP, Hs, HM, C, TC, w_hh, bd, hm):
        """The forward loop in PyTorch operations (any device); returns the R_t."""
        H, Kt = Hs.shape[-1], sum(Ks)
        groups = _groups(Ks)
        h_in, h_out = S.states_in(Hs), S.states_out(Hs)
        v_in, xks, xps = S.states_in(V), S.per_step(XK), S.per_step(XP)
        rs = []  # R_t (rows, K*H): every W_g[j] h'_{t-1}, one tensor per step
        hms = S.per_step(HM) if HM is not None else None
        w_key_t, bd_t = w_hh[:Kt].t(), bd.t()  # small: the key logits' h- and v-columns
        choice = StepProduct(w_hh[Kt:].t(), S.B, S.T)  # the choice matrices: the big per-step product
        if memory:
            c_in, c_out, tcs = S.states_in(C), S.states_out(C), S.per_step(TC)
            XP4 = XP.view(S.N, 4, H)
            zg, zc = S.per_step(XP[:, :3 * H]), S.per_step(XP[:, 3 * H:])
            zi, zf, zo = (S.per_step(XP4[:, k]) for k in range(3))
        one = len(groups) == 1  # the softmax outputs are whole rows (contiguous)
        Vn = V[S.B:]
        # per group, the per-step views every step needs (made once, not per step)
        gviews = []
        for b0, nb, k, ko in groups:
            kk, hc, rc = _cols(b0, nb, k, ko, H)
            gviews.append((_per_step(S, XK, kk, nb, k), _per_step(S, Vn, kk, nb, k),
                           _per_step(S, Vn, kk, 1, k, times=nb),
                           _per_step(S, XP, hc, 1, H, times=nb), (rc, nb, k, H)))
        for t in range(S.T):
            m = S.rows(t)
            hp = h_in[t] if hms is None else torch.mul(h_in[t], hm[:m], out=hms[t])
            xks[t].addmm_(hp, w_key_t).addmm_(v_in[t], bd_t)  # eqs 6 / 9-15: the key logits
            r = choice(hp)  # every W_g[j] h'_{t-1}
            rs.append(r)
            for lg3, v3, vb, preb, (rc, nb, k, H_) in gviews:
                _softmax(lg3[t], v3[t], one)
                # eqs 7 / 10-16: pre_g += sum_j v_g[j] (W_g[j] h'), one batched product
                preb[t].baddbmm_(vb[t], r[:, rc].view(m * nb, k, H_))
            pre = xps[t]
            if not memory:
                torch.tanh(pre, out=h_out[t])  # eq 8
            else:
                zg[t].sigmoid_()  # eqs 17-19
                zc[t].tanh_()  # eq 20
                c = torch.mul(zf[t], c_in[t], out=c_out[t])
                c.addcmul_(zi[t], zc[t])  # eq 21
                torch.mul(zo[t], torch.tanh(c, out=tcs[t]), out=h_out[t])  # eq 22
        return rs

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn, dvn):
        X, w_ih, w_hh, bd, bias, hm, V, XP, Hs, HM, C, TC, *rs = ctx.saved_tensors
        memory, Ks = ctx.memory, ctx.Ks
        S: Steps = ctx.steps
        B, H = S.B, Hs.shape[-1]
        n, Kt = len(Ks), sum(Ks)
        DH, dh0_direct = S.grads(dout, dhn, Hs)
        DV, dv0_direct = S.grads(None, dvn, V)  # dv_t (+ carry)
        DPRE = XP.new_empty(S.N, n * H)  # gradient of the pre-activations (= of W_g^hx x_t)
        dR = XP.new_empty(S.N, Kt + Kt * H)  # gradient of h' W_hh^T: [d logits, d R]
        DL = XP.new_empty(S.N, Kt)  # d logits (contiguous; copied into dR per step)
        # mmLSTM: dc_t from the final states (the carry from t+1 is added in place)
        DC, dc0_direct = S.grads(None, dcn, C) if memory else (None, None)
        if ctx.native is not None:  # the reverse loop in one C call (multi_bwd)
            dh0, dv0 = XP.new_empty(B, H), XP.new_empty(B, Kt)
            dc0 = XP.new_empty(B, H) if memory else None
            ctx.native.call("multi_bwd", XP.dtype, memory=int(memory), n=n, Ks=Ks, T=S.T, B=B,
                            off=S.off, H=H, par_min=native.PAR_MIN, V=V, R=rs[0], XP=XP, C=C, TC=TC,
                            Hs=Hs, DH=DH, DV=DV, DC=DC, DPRE=DPRE, dR=dR, DL=DL, dh0=dh0, dv0=dv0,
                            dc0=dc0, w_hh=w_hh, bd=bd, hmask=hm, tmp=XP.new_empty(B * H))
        else:
            dh0, dv0, dc0 = MultiMatrixRecurrence._backward_loop(
                memory, Ks, S, V, XP, Hs, C, TC, rs, DH, DV, DC, DPRE, dR, DL, w_hh, bd, hm)
        dx, grads = multi_weight_grads(ctx.needs_input_grad, Ks, X, w_ih, bias, S.prev(V),
                                       HM if HM is not None else S.prev(Hs), DPRE, dR, DL,
                                       ctx.products)
        return (None, None, None if dx is None else S.unpacked(dx), S.initial_grad(dh0, dh0_direct),
                S.initial_grad(dc0, dc0_direct) if memory else None,
                S.initial_grad(dv0, dv0_direct), *grads, None, None)

    @staticmethod
    def _backward_loop(memory, Ks, S: Steps, V, XP, Hs, C, TC, rs, DH, DV, DC, DPRE, dR, DL, w_hh,
                       bd, hm):
        """The backward loop in PyTorch operations: fills DPRE, dR, DL, adds the recurrent
        parts into DH, DV (and DC); returns dh_0, dv_0, dc_0 (sorted)."""
        B, H = S.B, Hs.shape[-1]
        Kt = sum(Ks)
        groups = _groups(Ks)
        dhs, dvs, dpres = S.per_step(DH), S.per_step(DV), S.per_step(DPRE)
        dRs, dls = S.per_step(dR), S.per_step(DL)
        one = len(groups) == 1
        rec = StepProduct(w_hh, B, S.T)  # dh' = [d logits, dR] W_hh
        if not memory:
            kzs = [1 - h * h for h in S.states_out(Hs)]
        else:
            XP4 = XP.view(S.N, 4, H)  # activations i, f, o, c^
            K, Kc = lstm_factors(XP4, S.prev(C), TC)
            dcs, kcs, ks, kos = (S.per_step(DC), S.per_step(Kc), S.per_step(K),
                                 S.per_step(K[:, 2]))
            DPRE4 = DPRE.view(S.N, 4, H)
            dp4s, dpos = S.per_step(DPRE4), S.per_step(DPRE4[:, 2])
            fs = S.per_step(XP4[:, 1])
        Vn = V[B:]
        gviews = []
        for b0, nb, k, ko in groups:
            kk, hc, rc = _cols(b0, nb, k, ko, H)
            rcd = slice(Kt + rc.start, Kt + rc.stop)
            gviews.append((_per_step(S, DV, kk, k, 1, times=nb),
                           [r[:, rc].view(r.shape[0] * nb, k, H) for r in rs],
                           _per_step(S, DPRE, hc, H, 1, times=nb), _per_step(S, Vn, kk, nb, k, 1),
                           _per_step(S, DPRE, hc, nb, 1, H), _per_step(S, dR, rcd, nb, k, H),
                           _per_step(S, DV, kk, nb, k), _per_step(S, Vn, kk, nb, k),
                           _per_step(S, DL, kk, nb, k)))
        dRk = S.per_step(dR[:, :Kt])
        dh0, dv0 = DH.new_zeros(B, H), DH.new_zeros(B, Kt)
        dc0 = DH.new_zeros(B, H) if memory else None
        for t in range(S.T - 1, -1, -1):
            m = S.rows(t)
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
            target = dhs[t - 1][:m] if t > 0 else dh0[:m]
            if hm is None:
                rec.add_to(target, dr)
            else:
                target.addcmul_(rec(dr), hm[:m])
            (dvs[t - 1][:m] if t > 0 else dv0[:m]).addmm_(dls[t], bd)  # the key's own recurrence
            if memory:
                if t > 0:
                    dcs[t - 1][:m].addcmul_(dc, fs[t])
                else:
                    torch.mul(dc, fs[0], out=dc0[:m])
        return dh0, dv0, dc0
