"""Compile every Triton kernel of ``lstmablate.cells.kernels`` for NVIDIA GPUs, ahead of
time, without a GPU: Triton's compiler runs on the CPU all the way to the GPU binary
(``cubin``), so a kernel that the interpreter runs but the GPU compiler would reject (a
type that does not unify across a loop, a constexpr branch that leaves a name undefined,
an unsupported operation) fails here, in the CPU test suite.

Run by ``tests/test_kernels_triton.py`` in a subprocess without ``TRITON_INTERPRET`` (in
the test process the kernels are interpreted functions, which do not compile):

    python tests/compile_triton_kernels.py 90 80     # the SM architectures to compile for
    python tests/compile_triton_kernels.py --all 90  # every combination of the switches

By default every kernel is compiled for each of its layouts with all its switches on (and
with a projection), in float32, and once more in bfloat16 (the kernels compute in float32
registers; the loads and stores convert; the memory cell's pointers stay float32, as the
loops allocate it); ``--all`` adds recurrent dropout off, in both dtypes.  Prints one line per
compiled variant and ``compiled N kernels`` at the end.
"""

from __future__ import annotations

import inspect
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lstmablate.cells.kernels.gru import triton_kernels as triton_gru
from lstmablate.cells.kernels.linear_scan import triton_kernels as triton_linear_scan
from lstmablate.cells.kernels.lstm import triton_kernels as triton_lstm
from lstmablate.cells.kernels.second_order import triton_kernels as triton_second_order
from lstmablate.cells.kernels.sru import triton_kernels as triton_sru

#: the scalar (int32) arguments of the kernels; every other non-constexpr argument is a pointer
SCALARS = {"n", "H", "P", "T", "B", "KT"}
#: pointers to int32 (the step offsets, the sorted lengths); the rest point at the buffers'
#: dtype
INT_POINTERS = {"OFF", "LEN"}
#: the memory cell and its gradients: float32 in a float16 / bfloat16 call
#: (``triton_common.memory_dtype``) when the layout has a memory cell (else they are h's)
MEMORY_POINTERS = {"C", "C0", "C1", "DC", "DCP", "DC0"}

LSTM_LAYOUTS = [dict(NB=4, NG=3, FI=1, OI=2, MEMORY=True, SRNN=True),  # lstm
                dict(NB=3, NG=2, FI=1, OI=-1, MEMORY=True, SRNN=False),  # lstm-srnn-out
                dict(NB=3, NG=2, FI=-1, OI=1, MEMORY=True, SRNN=True),  # lstm-noforget
                dict(NB=2, NG=1, FI=0, OI=-1, MEMORY=True, SRNN=False),  # knn-rnn (coupled i)
                dict(NB=1, NG=0, FI=-1, OI=-1, MEMORY=False, SRNN=True)]  # lstm-gates, mrnn
ALL_FLAGS = [dict(HAS_MASK=m) for m in (False, True)]
FLAGS = ALL_FLAGS[-1:]
MM = [dict(K0=4, K1=0, K2=0, K3=0, MEMORY=False, BLOCK_K=4),
      dict(K0=4, K1=2, K2=4, K3=3, MEMORY=True, BLOCK_K=4)]


def variants():
    """(kernel, constexprs) for every kernel, across its switches."""
    for layout in LSTM_LAYOUTS:
        for proj in (False, True):
            for flags in FLAGS:
                yield triton_lstm.lstm_step, dict(layout, PROJ=proj, **flags)
        yield triton_lstm.lstm_step_grad, dict(layout)
        scan = {k: v for k, v in layout.items() if k != "MEMORY"}
        if layout["MEMORY"]:
            yield triton_lstm.lstm_scan, scan
            yield triton_lstm.lstm_scan_grad, scan
    for flags in FLAGS:
        yield triton_gru.gru_step, flags
        yield triton_gru.gru_out, flags
        for mm in MM:
            yield triton_second_order.mm_step, dict(mm, BLOCK_H=256, **flags)
    for reset_after in (False, True):
        yield triton_gru.gru_step_grad, dict(RESET_AFTER=reset_after)
    for mm in MM:
        yield triton_second_order.mm_step_grad, dict(mm, BLOCK_H=256)
    yield triton_gru.gru_gates, {}
    yield triton_gru.gru_reset_grad, {}
    yield triton_linear_scan.linear_scan, {}
    yield triton_linear_scan.linear_scan_grad, {}
    yield triton_sru.sru_memory, {}
    yield triton_sru.sru_memory_grad, {}


def signature(kernel, constexprs: dict, dtype: str) -> tuple[dict, dict]:
    names = list(inspect.signature(kernel.fn).parameters)
    consts = dict(constexprs)
    consts.setdefault("ACC", tl.float32)
    if "BLOCK" in names:
        consts.setdefault("BLOCK", 256)
    sig = {}
    for name in names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in SCALARS:
            sig[name] = "i32"
        elif name in INT_POINTERS:
            sig[name] = "*i32"
        elif name in MEMORY_POINTERS and constexprs.get("MEMORY", True):
            sig[name] = "*fp32"
        else:
            sig[name] = f"*{dtype}"
    return sig, consts


def main(archs: list[int], every: bool = False) -> int:
    global FLAGS
    if every:
        FLAGS = ALL_FLAGS
    count = 0
    for arch in archs:
        target = GPUTarget("cuda", arch, 32)
        for dtype in ("fp32", "bf16"):
            seen = set()
            for kernel, constexprs in variants():
                if dtype == "bf16" and not every:  # one variant per kernel
                    if kernel in seen:
                        continue
                    seen.add(kernel)
                sig, consts = signature(kernel, constexprs, dtype)
                compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts),
                                          target=target)
                assert compiled.asm.get("cubin"), f"{kernel.fn.__name__}: no cubin"
                print(f"sm_{arch} {dtype} {kernel.fn.__name__} {constexprs}")
                count += 1
    print(f"compiled {count} kernels")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    raise SystemExit(main([int(a) for a in args if a != "--all"] or [90], "--all" in args))
