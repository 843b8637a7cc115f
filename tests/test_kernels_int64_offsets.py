"""The Triton kernels that loop over time inside one launch (the scan of ``lstm-srnn-hidden``,
``lstm/triton_kernels.lstm_scan`` / ``lstm_scan_grad``) address row b of step t of a packed
buffer at (off[t] + b) x nb*H: past 2**31 elements (the real tokens x nb*H of a
character-level or long Billion Word batch, e.g. 640,000 tokens with H = 1,024 and four
blocks) that product wraps around in int32, and the kernel would read and write at a
negative offset.  Such a buffer is 8 GB and more, beyond what the interpreter can run on
CPU, so the offset arithmetic itself is checked: ``triton_common.row_base`` (through
``step_base``), which every such offset goes through, at products past 2**31, under the
interpreter (whose int32 arithmetic wraps as the GPU's does); and no time-indexed offset in
the kernels' source bypasses it.  The step kernels (one launch per step) get each step's
pointer from the host, in 64 bits; their offsets within one step stay below
B x nb*H <= 8,192 x 4 x 32,768 = 2**30 (the configs' largest batch and width).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lstmablate.cells.kernels.common import triton_support

pytestmark = pytest.mark.skipif(not triton_support.interpreting(),
                                reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
KERNELS = Path(__file__).resolve().parents[1] / "lstmablate" / "cells" / "kernels"
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from lstmablate.cells.kernels.common.triton_common import row_base, step_base  # noqa: E402


@triton.jit
def offsets(OUT, WRAPPED, T0, T, n, NB: tl.constexpr):
    """Step T0 + s's offset for s < T: through ``step_base``, and as the int32 product."""
    for s in range(0, T):  # an int32 loop variable, as in the scan kernels
        t = T0 + s
        tl.store(OUT + s, step_base(t, n * NB))
        tl.store(WRAPPED + s, t * (n * NB))


def test_step_offsets_past_two_to_the_31_do_not_wrap():
    T, B, H, NB = 3, 64, 1024, 4  # steps 10,000 .. 10,002 of a character-level batch
    out = torch.zeros(T, dtype=torch.int64)
    wrapped = torch.zeros(T, dtype=torch.int32)
    start = 10_000
    offsets[(1,)](out, wrapped, start, T, B * H, NB=NB)
    want = [(start + s) * B * H * NB for s in range(T)]
    assert all(w > 2**31 for w in want)
    assert out.tolist() == want
    assert wrapped.tolist() != want  # what int32 arithmetic would have addressed


@triton.jit
def row_offsets(OUT, WRAPPED, OFF, T, b, NB: tl.constexpr, H: tl.constexpr):
    """Row b of steps 0..T-1 of a packed buffer: through ``row_base``, and in int32."""
    for t in range(0, T):
        tl.store(OUT + t, row_base(OFF, t, b, NB * H))
        tl.store(WRAPPED + t, (tl.load(OFF + t) + b) * (NB * H))


def test_packed_row_offsets_past_two_to_the_31_do_not_wrap():
    H, NB, b = 1024, 4, 5
    off = torch.tensor([600_000, 640_000, 680_000], dtype=torch.int32)  # late steps of a batch
    out = torch.zeros(3, dtype=torch.int64)
    wrapped = torch.zeros(3, dtype=torch.int32)
    row_offsets[(1,)](out, wrapped, off, 3, b, NB=NB, H=H)
    want = [(o + b) * NB * H for o in off.tolist()]
    assert all(w > 2**31 for w in want)
    assert out.tolist() == want
    assert wrapped.tolist() != want  # what int32 arithmetic would have addressed


def test_every_time_indexed_offset_goes_through_step_base():
    """In the kernels' source, no offset multiplies a step index (``t``, ``t + 1``) by a size
    in int32: every one is ``step_base(t, size)``, or ``row_base`` for a packed row."""
    bad = []
    pattern = re.compile(r"\(?\bt\b(\s*\+\s*1)?\)?\s*\*\s*\(?\s*n\b")
    for path in sorted(KERNELS.rglob("triton_kernels.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                bad.append(f"{path.relative_to(KERNELS)}:{i}: {line.strip()}")
    assert not bad, "int32 step offsets:\n" + "\n".join(bad)
    scan = (KERNELS / "lstm" / "triton_kernels.py").read_text(encoding="utf-8")
    assert scan.count("row_base(") >= 5  # lstm_scan: 2 offsets, lstm_scan_grad: 3
    assert "OFF + t" not in scan  # (a step's offset is only ever read by row_base)
