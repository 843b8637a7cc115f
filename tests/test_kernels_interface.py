"""The interface between cells and their fast kernels (``kernels/interface.py``): every
family registered with what it reads, its C source and its cases; a family sees only what
it declared; the shared forward code is written once (no block of six repeated lines among
the kernel modules); a third-party cell registers a fast path of its own
(``tests/fixtures/thirdparty``), taken and matching its reference loop."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.cells.kernels import interface, native_build

KERNELS = Path(interface.__file__).resolve().parent
HERE = Path(__file__).resolve().parent
THIRD_PARTY = HERE / "fixtures" / "thirdparty"


def test_every_built_in_family_is_registered_with_its_sources_and_cases():
    fams = interface.families()
    assert {"lstm_family", "gru", "factored", "multi_matrix", "dyck"} <= set(fams)
    assert interface.native_sources() == {"lstm_family": "lstm_family.c", "gru": "gru.c",
                                          "second_order": "second_order.c"}
    for source in interface.native_sources().values():
        assert (native_build.CSRC / source).is_file()
    covered = {name for fam in fams.values() for name, _ in fam.cases}
    with_kernels = {n for n in available_cells() if get_cell(n).cls.fast_kernels is not None}
    assert with_kernels - covered <= {"dyck-rnn"}  # tested at its own sizes (1-d inputs)
    for fam in fams.values():
        for name, opts in fam.cases:  # every case builds and is run by its family
            cell = get_cell(name).build(3, 4, **opts)
            assert interface.family_of(cell) is fam, (fam.name, name, opts)


def test_a_family_reads_only_what_it_declared():
    for fam in interface.families().values():
        assert all(not a.startswith("_") for a in fam.reads), (fam.name, fam.reads)
        for name, opts in fam.cases:
            v = fam.view(get_cell(name).build(3, 4, **opts))
            assert set(vars(v)) == set(fam.reads)
    v = interface.family_of(get_cell("lstm").build(3, 4)).view(get_cell("lstm").build(3, 4))
    with pytest.raises(AttributeError):
        v._rec_index  # noqa: B018  (an internal of the cell: not part of the contract)


def test_call_descriptions_are_checked():
    with pytest.raises(TypeError, match="unknown call description"):
        interface.Call.of(devce_type="cuda")
    with pytest.raises(TypeError, match="must set `name` and `reads`"):
        interface.register(interface.KernelFamily())


def _windows(path: Path, n: int):
    """Every n consecutive code lines of a module (blank lines, comments, imports and
    docstring quotes left out)."""
    lines = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "import ", "from ")) or line in ('"""', ")"):
            continue
        lines.append((lineno, line))
    for k in range(len(lines) - n + 1):
        yield tuple(line for _, line in lines[k:k + n]), lines[k][0]


def test_no_block_of_six_lines_is_repeated_among_the_kernel_modules():
    seen = defaultdict(list)
    for path in sorted(KERNELS.glob("*.py")):
        for window, lineno in _windows(path, 6):
            seen[window].append(f"{path.name}:{lineno}")
    repeated = {w[0]: where for w, where in seen.items() if len(where) > 1}
    assert not repeated, "\n".join(f"{where}: {first}" for first, where in repeated.items())


_PLUGIN = """
import sys, torch
sys.path.insert(0, {tests!r})
from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.kernels.interface import families, kernel_name_of, plan_of
from fast_path_harness import assert_fast_matches_reference
cell = get_cell("toy-mgu").build(3, 4)
print("plan", plan_of(cell), kernel_name_of(cell), plan_of(cell, mask="other"))
print("family", "toy-mgu" in families(), families()["toy-mgu"].cases)
torch.manual_seed(0)
for rd in (0.0, 0.3):
    enc = build_encoder("toy-mgu", 3, 4, num_layers=2, bidirectional=True,
                        recurrent_dropout=rd).double().train()
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    state = (torch.randn(4, 4, 4, dtype=torch.float64),)
    assert_fast_matches_reference(enc, x, torch.tensor([6, 2, 0, 5]), state, 1e-10)
print("matches")
"""


def test_a_third_party_cell_registers_a_fast_path(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(THIRD_PARTY), str(HERE)]))
    r = subprocess.run([sys.executable, "-c", _PLUGIN.format(tests=str(HERE))], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {ln.split(" ", 1)[0]: ln for ln in r.stdout.splitlines()}
    assert lines["plan"] == "plan toy-loop toy-loop reference", lines["plan"]
    assert lines["family"] == "family True (('toy-mgu', {}),)"
    assert "matches" in lines


def test_the_encoder_asks_the_family_for_a_whole_stack(monkeypatch):
    """``Encoder.forward`` offers the whole stack to the cells' family first
    (``KernelFamily.stack``; None: layer by layer)."""
    enc = build_encoder("lstm-srnn", 3, 4, num_layers=2)
    fam = interface.family_of(enc.layers[0][0])
    seen = []
    monkeypatch.setattr(type(fam), "stack", lambda self, *a: seen.append(a) or None)
    out, _ = enc(torch.randn(2, 5, 3))
    assert len(seen) == 1 and seen[0][0] is enc and out.shape == (2, 5, 4)
    sentinel = (torch.zeros(5, 2, 4), (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))
    monkeypatch.setattr(type(fam), "stack", lambda self, *a: sentinel)
    out, st = enc(torch.randn(2, 5, 3))
    assert out.shape == (2, 5, 4) and st is sentinel[1]
