"""The fast paths of every cell whose gates read the inputs only: one shared scan.

Such a cell (``lstmablate/cells/_elementwise.py``: ``qrnn`` with any pooling and filter
width, ``sru-2017``, ``mingru``, ``minlstm``) keeps one memory updated element-wise,

    c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t,        h_t = readout(c_t),

with keep, write and content known before the recurrence runs.  So a whole call is

1. ``project_inputs(x)``: every matrix product of every step, one GEMM (ordinary autograd;
   on CPU on the faster of MKL's and oneDNN's GEMM here, ``common/gemm.py``);
2. ``sequence_terms(xp, state)``: keep, write, content (and what the readout needs) of every
   step at once, element-wise (ordinary autograd);
3. the memory: ONE element-wise pass over time, and its reverse pass for the backward,
   written by hand (``loops.LinearScan``: C on CPU, PyTorch loops elsewhere;
   ``triton_kernels.TritonLinearScan``: one launch each way);
4. ``readout(c, terms)`` of every step at once, and ``next_state`` for the final state
   (ordinary autograd).

A cell whose ``log_space`` is true (minGRU and minLSTM with ``mode: log``: positive contents,
Feng et al.'s log-space parallel scan) gives ``log_terms(xp)`` (log keep_t and log(write_t
content_t), element-wise from the projections) instead of 2, and 3 runs on log h_t
(``loops.LogLinearScan``, ``triton_kernels.TritonLogLinearScan``: L_t = logaddexp(log keep_t +
L_{t-1}, log value_t), the paper's logcumsumexp one step at a time); its memory comes back as
h_t itself, so 4 is unchanged (the readout gets the log terms).  Its initial memory must be
>= 0 (log h_0; 0 is an empty term); a call whose initial memory has a negative entry runs the
linear-domain pass on ``scan_terms``, the same equations (checking costs a device sync on a GPU).

The family calls the cell's own methods for 1, 2 and 4 (declared as the arithmetic it
reproduces: ``_elementwise.SCAN_MATH``), so every cell of this kind, a third-party one
included, runs on the same kernel with its own gates, and a subclass that changes one of
those methods runs the reference loop.  The cell's gates and readout are computed by the
same operations as in the reference loop, on (T, B, H) tensors instead of T tensors of
(B, H), so the only arithmetic of its own here is the pass over time.

Padding-free (prefix masks; the encoder reverses each sequence within its length for the
backward direction, so it too starts at each sequence's own last token): a call runs the
packed layout of ``common/sequences.Steps`` (rows sorted by length once per call; step t
runs the sequences still running), so the products, the terms, the pass and the readout are
computed over real tokens only, and what is kept for the backward holds nothing else.  A
cell's methods are element-wise over rows, so they run on the packed (N, *) tokens as they
do on (T, B, *) ones: ``project_inputs`` on the packed inputs, ``scan_terms`` with each
token's row of the initial state (``terms_read_one_step``; a cell whose ``sequence_terms``
reads across steps, the width-2 QRNN, gets its projections back in the (T, B) layout for
that one call and its terms packed again), ``readout`` and ``next_state`` per token.  The
outputs are exactly zero at padding (so no gradient enters there), each state component is
taken at the row's last real step (the initial state for a length-0 row).  Without padding
the layout is the plain time-major one and nothing is sorted or copied.  The QRNN's zoneout
(training) draws its mask for all tokens at once: the same distribution as the reference
loop's per-step draws, another sequence of random numbers.

Paths (``interface.KernelPath``):

* ``scan``: the pass in C (``linear_scan.c``, CPU, float32 / float64) or in PyTorch loops
  (``LSTMABLATE_NATIVE=0``, no compiler, CUDA without Triton, CUDA float64);
* ``triton-scan``: the pass on Triton (CUDA; CPU tensors under Triton's interpreter with
  ``LSTMABLATE_TRITON=1``), also under autocast: the cell's products and element-wise work
  autocast as in the reference loop (``autocast_inside``), the memory and its gradient are
  carried in float32;
* ``reference``: a cell whose gates read its state (``linear_scan`` is False; the registered
  2018 ``sru`` runs its own family, ``sru/``), autocast without Triton, and the shared refusals
  (``call.refused``).

``lstm-srnn-hidden(-out)`` are linear scans too, but keep the LSTM family's own scan
(``lstm/``): its C loop fuses the gates' activations, the memory and tanh(c_t) into the same
pass (and its backward), which this kernel, given the terms already activated, cannot (with
the same GEMM the LSTM's took 254 ms where this one took 268 ms: linear_scan/README.md).
"""

from __future__ import annotations

from contextlib import nullcontext

from torch import Tensor

from ..common.dispatch import describe, native_loops, triton_runs
from ..common.gemm import faster_products
from ..common.sequences import Steps
from ..call import Call
from ..interface import KernelFamily, KernelPath, NativeSource, register
from .loops import LIBRARY, LinearScan, LogLinearScan


class LinearScanKernels(KernelFamily):
    name = "linear_scan"
    reads = ("linear_scan", "memory_index", "terms_read_one_step", "project_inputs",
             "scan_terms", "sequence_terms", "readout", "next_state", "log_space", "log_terms")
    paths = (KernelPath.TRITON_SCAN, KernelPath.SCAN)
    native = NativeSource(LIBRARY, "linear_scan.c")
    autocast_inside = True
    #: every linear-scan cell with the options that change its terms or readout (the 2018 SRU,
    #: whose gates read c_{t-1}, has a family of its own: ``sru/``)
    cases = (("qrnn", {}), ("qrnn", {"gates": "f"}), ("qrnn", {"gates": "ifo"}),
             ("qrnn", {"window": 2}), ("qrnn", {"gates": "f", "window": 2}),
             ("qrnn", {"gates": "ifo", "window": 2}), ("sru-2017", {}),
             ("sru-2017", {"activation": "identity"}), ("mingru", {}),
             ("mingru", {"positive_content": True}), ("mingru", {"mode": "log"}),
             ("minlstm", {}), ("minlstm", {"positive_content": True}),
             ("minlstm", {"mode": "log"}))

    def choose(self, v, call: Call) -> KernelPath:
        if not v.linear_scan:
            return KernelPath.REFERENCE
        if triton_runs(call):
            return KernelPath.TRITON_SCAN
        return KernelPath.REFERENCE if call.autocast else KernelPath.SCAN

    def describe(self, path: KernelPath, v, call: Call) -> str:
        return describe(path, call, native_loops(self, call))

    def run(self, path, v, x, state, lengths, h_mask):
        if path is KernelPath.SCAN:
            return scan_sequence(v, (LinearScan, LogLinearScan), x, state, lengths)
        if path is KernelPath.TRITON_SCAN:
            from .triton_kernels import TritonLinearScan, TritonLogLinearScan

            return scan_sequence(v, (TritonLinearScan, TritonLogLinearScan), x, state, lengths)
        raise self.unknown(path)


def scan_sequence(v, functions, x: Tensor, state: tuple[Tensor, ...], lengths: Tensor | None):
    """One call of a linear-scan cell (``v``: its view) with the memory's passes ``functions``
    (``LinearScan`` and ``LogLinearScan``, or their Triton twins), over the real tokens only;
    see the module docstring.  ``h_mask`` has no part in it: no product reads h_{t-1}."""
    T, B, _ = x.shape
    S = Steps(T, B, lengths, x.device)
    with faster_products() if x.device.type == "cpu" else nullcontext():  # (common/gemm.py)
        xp = v.project_inputs(S.pack(x))  # every matrix product, all real tokens at once
    c0 = state[v.memory_index]
    if v.log_space and not bool((c0 < 0).any()):  # log h_0 exists (a device sync on a GPU)
        terms = v.log_terms(xp)  # log keep, log value of every real token (element-wise)
        C = functions[1].apply(S, terms["log_keep"], terms["log_value"], c0)
    else:
        terms = packed_terms(v, S, xp, state)  # keep, write, content, ... of every real token
        C = functions[0].apply(S, terms["keep"], terms["write"], terms["content"], c0)
    memory = C[B:]
    h = v.readout(memory, terms)  # h_t of every real token
    steps = v.next_state(h, memory, xp)  # the state after every token, component by component
    finals = tuple(S.final(C) if k == v.memory_index else S.final_rows(s, s0)
                   for k, (s, s0) in enumerate(zip(steps, state)))
    return S.unpack(h), finals


def packed_terms(v, S: Steps, xp: Tensor, state: tuple[Tensor, ...]) -> dict[str, Tensor]:
    """The cell's terms of every real token (N, H each) from its projections ``xp`` (N, *)."""
    if not S.padded:  # the (T, B) layout itself: the cell's own sequence_terms
        terms = v.sequence_terms(xp.view(S.T, S.B, -1), state)
        return {name: t.reshape(S.N, *t.shape[2:]) for name, t in terms.items()}
    if v.terms_read_one_step:  # a token's terms read its projections and its initial state
        return v.scan_terms(xp, tuple(S.per_row(S.sort(s)) for s in state))
    terms = v.sequence_terms(S.unpack(xp), state)  # the terms read across steps
    return {name: S.pack(t) for name, t in terms.items()}


KERNELS = register(LinearScanKernels())
