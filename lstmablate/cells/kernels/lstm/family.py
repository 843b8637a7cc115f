"""The fast paths of the LSTM family (``lstmablate/cells/lstm.py``): which one a call takes
(:meth:`LSTMFamilyKernels.choose`) and running it (:meth:`LSTMFamilyKernels.run`).
Its folder holds everything of the family: this module, the recurrence (``recurrent.py``),
the scan (``scan.py``), the Triton kernels (``triton_kernels.py``) and the C loops
(``lstm_family.c``); what it shares with the other families is ``../common/``.

Paths (``interface.KernelPath``):

* ``torch-lstm`` / ``torch-rnn``: ``lstm`` (``lstm-gates``) is exactly what
  ``torch.nn.LSTM`` (``RNN``) computes, so PyTorch's fused kernel runs it
  (``common/delegate.py``): on CUDA cuDNN, with our parameters kept in cuDNN's layout between
  calls, and a whole stacked (bidirectional) encoder in one call where its options allow
  (:meth:`LSTMFamilyKernels.stack`); on CPU (oneDNN / ATen) when the native kernel is
  unavailable, when ``LSTMABLATE_TORCH_ON_CPU=1``, or when the calibrated timing found it
  faster for the call's shape class on this machine (``common/calibrate.py``; fixed-length calls
  only: with variable lengths PyTorch packs the sequence, and its packed CPU backward is
  far slower than ours, see ``dispatch.prefer_torch_on_cpu``).  Not with recurrent dropout
  or a length-0 sequence (neither maps onto PyTorch's kernels), nor, on CPU, with a
  projection (oneDNN has none);
* ``triton-recurrent`` / ``triton-scan``: the Triton kernels (``triton_kernels.py``): on CUDA
  every other call (``LSTMABLATE_TRITON=1``: every call);
* ``recurrent``: the hand-written recurrence (``recurrent.py``; native on CPU, PyTorch
  loops elsewhere); like the Triton recurrence, it also computes a coupled input gate, i_t =
  1 − f_t (``recurrent.Layout.coupled``: ``knn-rnn``'s view, ``additive/family.py``), which
  ``describe`` names;
* ``scan``: nothing reads h_{t-1} (``scan.py``);
* ``reference``: the cell's own step loop (forced, autocast, a mask with holes, another
  dtype; ``call.refused``).
"""

from __future__ import annotations

from ..common import calibrate, delegate
from ..common.delegate import CudnnStack
from ..common.dispatch import describe, native_loops, torch_or_ours
from ..call import Call
from ..interface import KernelFamily, KernelPath, NativeSource, register
from .recurrent import layout, recurrent
from .scan import scan


def torch_kind(v, call: Call) -> str | None:
    """"lstm" / "rnn" when PyTorch's own LSTM / RNN could run this call, else None."""
    if call.h_mask or call.mask == "prefix0":
        return None
    if not v.memory_cell:  # eq 1, the S-RNN: exactly torch.nn.RNN(tanh)
        return "rnn"
    plain = (v.content == "srnn" and v.use_forget_gate and v.use_output_gate
             and v.gates_see_hidden)
    if plain and (not v.proj_size or call.device_type == "cuda"):
        return "lstm"
    return None


class LSTMFamilyKernels(CudnnStack, KernelFamily):
    name = "lstm_family"
    reads = ("input_size", "hidden_size", "output_size", "state_sizes", "blocks",
             "recurrent_blocks", "content", "memory_cell", "use_forget_gate", "use_output_gate",
             "gates_see_hidden", "proj_size", "weight_ih", "weight_hh", "bias", "weight_hr",
             "torch_weights", "parameters")
    paths = (KernelPath.TORCH_LSTM, KernelPath.TORCH_RNN, KernelPath.TRITON_RECURRENT,
             KernelPath.TRITON_SCAN, KernelPath.RECURRENT, KernelPath.SCAN)
    native = NativeSource("lstm_family", "lstm_family.c")
    #: every flag set of the registry, plus the options that change the kernel
    cases = (("lstm", {}), ("lstm-srnn", {}), ("lstm-srnn-out", {}), ("lstm-srnn-hidden", {}),
             ("lstm-srnn-hidden-out", {}), ("lstm-gates", {}), ("lstm-noforget", {}),
             ("lstm", {"proj_size": 3}), ("lstm", {"content_bias": False}),
             ("lstm", {"gates_see_hidden": False}), ("lstm-srnn", {"content_bias": True}),
             ("lstm-srnn-hidden", {"proj_size": 2}), ("lstm-noforget", {"gates_see_hidden": False}),
             ("lstm-srnn-hidden-out", {"forget_gate": False}), ("lstm-srnn-out", {"proj_size": 2}))

    def choose(self, v, call: Call) -> KernelPath:
        kind = torch_kind(v, call)
        ours = KernelPath.SCAN if v.weight_hh is None else KernelPath.RECURRENT
        sc = None if call.batch is None else (lambda: calibrate.shape_class(
            kind, self.native.library, v.input_size, v.hidden_size, call.batch, call.dtype,
            call.grad))
        return torch_or_ours(kind, ours, call, lambda: native_loops(self, call), sc,
                             self._runners(v, kind, call.batch))

    @staticmethod
    def _runners(v, kind, batch):
        """The two paths of a calibration, on random data of the shape class."""
        def make(sc: calibrate.ShapeClass) -> dict:
            x, state = calibrate.random_call(sc, v.state_sizes, batch)
            theirs = delegate.torch_lstm if kind == "lstm" else delegate.torch_rnn
            return {"native": calibrate.runner(lambda: recurrent(v, x, state, None, None), v, x,
                                               sc.grad),
                    "torch": calibrate.runner(lambda: theirs(v, x, state, None), v, x, sc.grad)}
        return make

    def describe(self, path: KernelPath, v, call: Call) -> str:
        # knn-rnn's view: one recurrent gate, i_t = 1 - f_t
        return describe(path, call, native_loops(self, call), torch_kind(v, call) is not None,
                        detail="coupled i = 1 - f" if layout(v).coupled else "")

    def run(self, path, v, x, state, lengths, h_mask):
        if path is KernelPath.TORCH_LSTM:
            return delegate.torch_lstm(v, x, state, lengths)
        if path is KernelPath.TORCH_RNN:
            return delegate.torch_rnn(v, x, state, lengths)
        if path is KernelPath.TRITON_SCAN:
            from . import triton_kernels

            return triton_kernels.scan(v, layout(v), x, state, lengths)
        if path is KernelPath.TRITON_RECURRENT:
            from . import triton_kernels

            return triton_kernels.recurrent(v, layout(v), x, state, lengths, h_mask)
        if path is KernelPath.SCAN:
            return scan(v, x, state, lengths)
        if path is KernelPath.RECURRENT:
            return recurrent(v, x, state, lengths, h_mask)
        raise self.unknown(path)

    def torch_kind(self, v, call: Call) -> str | None:
        return torch_kind(v, call)


KERNELS = register(LSTMFamilyKernels())
