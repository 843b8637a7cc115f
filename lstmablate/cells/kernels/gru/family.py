"""The fast paths of the GRU (``lstmablate/cells/gru.py``; Neubig eqs 56-59, Cho et al.
2014): which one a call takes (:meth:`GRUKernels.choose`) and running it.  Its folder
holds everything of the family: this module, the recurrence (``recurrent.py``), the Triton
kernels (``triton_kernels.py``) and the C loops (``gru.c``); what it shares with the other
families is ``../common/``.  Paths (``interface.KernelPath``):

* ``torch-gru``: with ``reset_after`` the cell is exactly ``torch.nn.GRU``, so PyTorch's
  fused kernel runs it (``common/delegate.py``): on CUDA (cuDNN, the weights kept in its layout,
  a whole stacked encoder in one call where its options allow); on CPU when the native
  kernel is unavailable, with ``LSTMABLATE_TORCH_ON_CPU=1``, or when the calibrated timing
  found it faster here for a fixed-length call (``common/calibrate.py``; variable lengths keep
  ours, see ``dispatch.prefer_torch_on_cpu``).  Not with recurrent dropout or a length-0 row.
* ``triton-recurrent``: the Triton kernels (``triton_kernels.py``): on CUDA every other call.
* ``recurrent``: ``recurrent.RecurrentGRU``, the recurrence with a hand-written BPTT, in C on
  CPU (``gru.c``) and in PyTorch loops elsewhere; eq 58 as printed (the reset gate
  before W_hh) has no PyTorch counterpart, so it always runs here (or in Triton).
* ``reference``: the cell's own step loop (``call.refused``).
"""

from __future__ import annotations

from ..common import calibrate, delegate
from ..common.delegate import CudnnStack
from ..common.dispatch import describe, native_loops, torch_or_ours
from ..call import Call
from ..interface import KernelFamily, KernelPath, NativeSource, register
from .recurrent import RecurrentGRU


def torch_kind(v, call: Call) -> str | None:
    """"gru" when torch.nn.GRU's kernel could run this call, else None."""
    return "gru" if v.reset_after and not call.h_mask and call.mask != "prefix0" else None


class GRUKernels(CudnnStack, KernelFamily):
    name = "gru"
    reads = ("input_size", "hidden_size", "state_sizes", "reset_after", "weight_ih", "weight_hh",
             "bias", "bias_hh", "parameters")
    paths = (KernelPath.TORCH_GRU, KernelPath.TRITON_RECURRENT, KernelPath.RECURRENT)
    native = NativeSource("gru", "gru.c")
    cases = (("gru", {}), ("gru", {"reset_after": True}))

    def torch_kind(self, v, call: Call) -> str | None:
        return torch_kind(v, call)

    def choose(self, v, call: Call) -> KernelPath:
        kind = torch_kind(v, call)
        sc = None if call.batch is None else (lambda: calibrate.shape_class(
            "gru", self.native.library, v.input_size, v.hidden_size, call.batch, call.dtype,
            call.grad))
        return torch_or_ours(kind, KernelPath.RECURRENT, call, lambda: native_loops(self, call), sc,
                             self._runners(v, call.batch))

    @staticmethod
    def _runners(v, batch):
        def make(sc: calibrate.ShapeClass) -> dict:
            x, (h0,) = calibrate.random_call(sc, (v.hidden_size,), batch)
            return {"native": calibrate.runner(lambda: _recurrent(v, x, h0, None, None), v, x,
                                               sc.grad),
                    "torch": calibrate.runner(lambda: delegate.torch_gru(v, x, h0, None), v, x,
                                              sc.grad)}
        return make

    def describe(self, path: KernelPath, v, call: Call) -> str:
        return describe(path, call, native_loops(self, call), torch_kind(v, call) is not None)

    def run(self, path, v, x, state, lengths, h_mask):
        if path is KernelPath.TORCH_GRU:
            return delegate.torch_gru(v, x, state[0], lengths)
        if path is KernelPath.TRITON_RECURRENT:
            from . import triton_kernels

            return triton_kernels.recurrent(v, x, state[0], lengths, h_mask)
        if path is KernelPath.RECURRENT:
            return _recurrent(v, x, state[0], lengths, h_mask)
        raise self.unknown(path)


def _recurrent(v, x, h0, lengths, h_mask):
    out, hn = RecurrentGRU.apply(v.reset_after, x, h0, v.weight_ih, v.weight_hh, v.bias,
                                 v.bias_hh, h_mask, lengths)
    return out, (hn,)


KERNELS = register(GRUKernels())
