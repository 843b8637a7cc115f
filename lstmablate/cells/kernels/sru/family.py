"""The fast paths of the 2018 SRU (``lstmablate/cells/sru.py``: ``sru``), whose gates read
the memory element-wise (eqs 1, 3: v ∘ c_{t-1}).  No matrix multiplies the state, so a whole
call is

1. ``project_inputs(x)``: every matrix product of every step, one GEMM (ordinary autograd;
   on CPU on the faster of MKL's and oneDNN's GEMM here, ``common/gemm.py``);
2. the memory (eqs 1-2): ONE element-wise pass over time, and its reverse pass for the
   backward, written by hand, from the forget gate's input products, the content and v_f
   (the cell's ``memory_inputs``): ``loops.SRUMemory`` (C on CPU, PyTorch loops elsewhere),
   ``triton_kernels.TritonSRUMemory`` (one launch each way);
3. the cell's own ``scan_terms`` of every step at once, given c_{t-1} of every step from 2
   (the reset gate of eq 3 reads it), ``readout`` (eq 4) and ``next_state`` (ordinary
   autograd: the gradient of everything that reads c_{t-1} reaches the memory's pass).

The family calls the cell's own methods for 1 and 3 (declared as the arithmetic it
reproduces), so its only arithmetic is eqs 1-2's pass.  ``scan_terms`` computes f_t once more
for all steps at once (what the readout does not read costs one sigmoid per element and no
gradient).

Padding-free (prefix masks; the encoder reverses each sequence within its length for the
backward direction): a call runs the packed layout of ``common/sequences.Steps`` (rows sorted
by length once; step t runs the sequences still running), so the products, the pass, the
gates and the readout are computed over real tokens only.  The cell's methods are
element-wise over rows, so they run on the packed (tokens, *) tensors as on (T, B, *) ones,
with each token's c_{t-1} and its row of the rest of the initial state.  The outputs are
exactly zero at padding, each state component is taken after the row's last real step (the
initial state for a length-0 row).

Paths (``interface.KernelPath``):

* ``recurrent``: the pass in C (``sru.c``, CPU, float32 / float64) or in PyTorch loops
  (``LSTMABLATE_NATIVE=0``, no compiler, CUDA without Triton, CUDA float64);
* ``triton-recurrent``: the pass on Triton (CUDA; CPU tensors under Triton's interpreter with
  ``LSTMABLATE_TRITON=1``), one launch each way, also under autocast: the cell's products and
  element-wise work autocast as in the reference loop (``autocast_inside``), the memory and
  its gradient are carried in float32;
* ``reference``: the class built without v (the 2017 form, which is not what this pass
  computes; the registered ``sru-2017`` runs the linear scan, ``linear_scan/``), autocast
  without Triton, and the shared refusals (``call.refused``).
"""

from __future__ import annotations

from contextlib import nullcontext

from torch import Tensor

from ..common.dispatch import describe, native_loops, triton_runs
from ..common.gemm import faster_products
from ..common.sequences import Steps
from ..call import Call
from ..interface import KernelFamily, KernelPath, NativeSource, register
from .loops import LIBRARY, SRUMemory


class SRUKernels(KernelFamily):
    name = "sru"
    reads = ("state_in_gates", "memory_index", "project_inputs", "memory_inputs", "scan_terms",
             "readout", "next_state")
    paths = (KernelPath.TRITON_RECURRENT, KernelPath.RECURRENT)
    native = NativeSource(LIBRARY, "sru.c")
    autocast_inside = True
    #: the 2018 SRU with each readout (every case is built at 3 x 4 too: with a skip
    #: projection, the input size unlike the hidden size)
    cases = (("sru", {}), ("sru", {"activation": "tanh"}), ("sru", {"init": "authors"}))

    def choose(self, v, call: Call) -> KernelPath:
        if not v.state_in_gates:
            return KernelPath.REFERENCE
        if triton_runs(call):
            return KernelPath.TRITON_RECURRENT
        return KernelPath.REFERENCE if call.autocast else KernelPath.RECURRENT

    def describe(self, path: KernelPath, v, call: Call) -> str:
        if path is KernelPath.TRITON_RECURRENT and call.device_type == "cuda":
            return f"{path} (one launch)"
        return describe(path, call, native_loops(self, call))

    def run(self, path, v, x, state, lengths, h_mask):
        if path is KernelPath.TRITON_RECURRENT:
            from .triton_kernels import TritonSRUMemory as memory
        elif path is KernelPath.RECURRENT:
            memory = SRUMemory
        else:
            raise self.unknown(path)
        return sru_sequence(v, memory, x, state, lengths)


def sru_sequence(v, function, x: Tensor, state: tuple[Tensor, ...], lengths: Tensor | None):
    """One call of the 2018 SRU (``v``: its view) with the memory's pass ``function``
    (``SRUMemory`` or its Triton twin), over the real tokens only; see the module docstring.
    ``h_mask`` has no part in it: no product reads h_{t-1}."""
    T, B, _ = x.shape
    S = Steps(T, B, lengths, x.device)
    with faster_products() if x.device.type == "cpu" else nullcontext():  # (common/gemm.py)
        xp = v.project_inputs(S.pack(x))  # every matrix product, all real tokens at once
    k = v.memory_index
    C = function.apply(S, *v.memory_inputs(xp), state[k])  # c_0 (sorted), then every c_t
    # what each token's step read: c_{t-1}, and its row of the rest of the initial state
    before = tuple(S.prev(C) if i == k else S.per_row(S.sort(s)) for i, s in enumerate(state))
    memory = C[B:]
    h = v.readout(memory, v.scan_terms(xp, before))  # eqs 3-4 for every token
    steps = v.next_state(h, memory, xp)  # the state after every token, component by component
    finals = tuple(S.final(C) if i == k else S.final_rows(s, s0)
                   for i, (s, s0) in enumerate(zip(steps, state)))
    return S.unpack(h), finals


KERNELS = register(SRUKernels())
