"""The fast paths of the GRU (``lstmablate/cells/gru.py``; Neubig eqs 56-59, Cho et al.
2014): which one a call takes (:meth:`GRUKernels.choose`) and running it.

* ``torch-gru``: with ``reset_after`` the cell is exactly ``torch.nn.GRU``, so PyTorch's
  fused kernel runs it (``delegate.py``): on CUDA (cuDNN, the weights kept in its layout,
  a whole stacked encoder in one call where its options allow); on CPU when the native
  kernel is unavailable, with ``LSTMABLATE_TORCH_ON_CPU=1``, or when the calibrated timing
  found it faster here for a fixed-length call (``calibrate.py``; variable lengths keep
  ours, see ``dispatch.prefer_torch_on_cpu``).  Not with recurrent dropout or a length-0 row.
* ``triton-recurrent``: the Triton kernels (``triton_gru.py``): on CUDA every other call.
* ``recurrent``: ``gru_recurrent.RecurrentGRU``, the recurrence with a hand-written BPTT, in C on
  CPU (``csrc/gru.c``) and in PyTorch loops elsewhere; eq 58 as printed (the reset gate
  before W_hh) has no PyTorch counterpart, so it always runs here (or in Triton).
* ``reference``: the cell's own step loop (``interface.refused``).
"""

from __future__ import annotations

from . import calibrate, delegate
from .delegate import CudnnStack
from .dispatch import describe, native_loops, torch_or_ours
from .gru_recurrent import RecurrentGRU
from .interface import Call, KernelFamily, NativeSource, register

def torch_kind(v, call: Call) -> str | None:
    """"gru" when torch.nn.GRU's kernel could run this call, else None."""
    return "gru" if v.reset_after and not call.h_mask and call.mask != "prefix0" else None


class GRUKernels(CudnnStack, KernelFamily):
    name = "gru"
    reads = ("input_size", "hidden_size", "state_sizes", "reset_after", "weight_ih", "weight_hh",
             "bias", "bias_hh", "parameters")
    native = NativeSource("gru", "gru.c")
    cases = (("gru", {}), ("gru", {"reset_after": True}))

    def torch_kind(self, v, call: Call) -> str | None:
        return torch_kind(v, call)

    def choose(self, v, call: Call) -> str:
        kind = torch_kind(v, call)
        sc = None if call.batch is None else (lambda: calibrate.shape_class(
            "gru", self.native.library, v.input_size, v.hidden_size, call.batch, call.dtype,
            call.grad))
        return torch_or_ours(kind, "recurrent", call, lambda: native_loops(self, call), sc,
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

    def describe(self, path: str, v, call: Call) -> str:
        return describe(path, call, native_loops(self, call), torch_kind(v, call) is not None)

    def run(self, path, v, x, state, lengths, h_mask):
        if path == "torch-gru":
            return delegate.torch_gru(v, x, state[0], lengths)
        if path == "triton-recurrent":
            from . import triton_gru

            return triton_gru.recurrent(v, x, state[0], lengths, h_mask)
        return _recurrent(v, x, state[0], lengths, h_mask)


def _recurrent(v, x, h0, lengths, h_mask):
    out, hn = RecurrentGRU.apply(v.reset_after, x, h0, v.weight_ih, v.weight_hh, v.bias,
                                 v.bias_hh, h_mask, lengths)
    return out, (hn,)


KERNELS = register(GRUKernels())
