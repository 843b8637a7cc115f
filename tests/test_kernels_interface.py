"""The interface between cells and their fast kernels (``kernels/interface.py``): every
family registered with what it reads, its paths, its C source and its cases; a family sees
only what it declared; a path is a member of the family's ``paths``, checked at dispatch;
the shared forward code is written once (no block of six repeated lines among the kernel
modules); a third-party cell registers a fast path of its own
(``tests/fixtures/thirdparty``), taken and matching its reference loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.cells.kernels import interface
from lstmablate.cells.kernels.call import Call
from lstmablate.cells.kernels.common import native_build

KERNELS = Path(interface.__file__).resolve().parent
HERE = Path(__file__).resolve().parent
THIRD_PARTY = HERE / "fixtures" / "thirdparty"


def test_every_built_in_family_is_registered_with_its_sources_and_cases():
    fams = interface.families()
    assert {"lstm_family", "gru", "factored", "multi_matrix", "dyck", "linear_scan", "additive",
            "sru"} <= set(fams)
    # each library's C source lies in its family's folder, beside the family's module
    assert interface.native_sources() == {
        "lstm_family": KERNELS / "lstm" / "lstm_family.c", "gru": KERNELS / "gru" / "gru.c",
        "second_order": KERNELS / "second_order" / "second_order.c",
        "linear_scan": KERNELS / "linear_scan" / "linear_scan.c",
        "sru": KERNELS / "sru" / "sru.c"}
    for source in (*interface.native_sources().values(),
                   *(native_build.CSRC / n for n in native_build.COMMON_SOURCES)):
        assert source.is_file()
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


CALLS = [dict(), dict(mask="prefix"), dict(mask="prefix0"), dict(h_mask=True),
         dict(device_type="cuda"), dict(device_type="cuda", triton=True),
         dict(device_type="cuda", triton=True, h_mask=True),
         dict(device_type="cuda", mask="prefix0"), dict(native=False, faster="torch"),
         dict(native=True, faster="native"), dict(mask="other"), dict(dtype=torch.float16)]


def test_every_family_takes_only_the_paths_it_declares():
    """``choose`` answers with a member of the family's ``paths`` (or the reference loop),
    over every case and a spread of calls; the built-in families' paths are KernelPath's."""
    for fam in interface.families().values():
        assert fam.paths and len(set(fam.paths)) == len(fam.paths), fam.name
        if type(fam).__module__.startswith("lstmablate."):
            assert all(isinstance(p, interface.KernelPath) for p in fam.paths), fam.name
        for name, opts in fam.cases:
            cell = get_cell(name).build(3, 4, **opts)
            for call in CALLS:
                path = fam.plan(cell, **call)
                assert path is interface.KernelPath.REFERENCE or path in fam.paths, (
                    fam.name, name, call, path)


def test_a_path_the_family_does_not_declare_is_an_error_at_dispatch(monkeypatch):
    cell = get_cell("gru").build(3, 4)
    fam = interface.family_of(cell)
    x = torch.randn(5, 2, 3)
    for wrong in ("recurrent",  # the right name, but a string: not the member
                  interface.KernelPath.SCAN):  # a member, but not one of the GRU's paths
        monkeypatch.setattr(fam, "choose", lambda v, call, _w=wrong: _w)
        with pytest.raises(interface.KernelPathError, match="'gru'.*not one of its paths"):
            fam.plan(cell)
        with pytest.raises(interface.KernelPathError):
            cell(x)  # the cell's forward goes through the same dispatch
    monkeypatch.undo()
    with pytest.raises(interface.KernelPathError, match="not one of its paths"):
        fam.run(interface.KernelPath.SCAN, fam.view(cell), x, (torch.zeros(2, 4),), None, None)


def test_a_family_must_declare_its_paths():
    class NoPaths(interface.KernelFamily):
        name, reads = "no-paths", ("weight_ih",)

    class StringPaths(NoPaths):
        paths = ("recurrent",)

    for cls in (NoPaths, StringPaths):
        with pytest.raises(TypeError, match="must set `paths`"):
            interface.register(cls())
    lstm = interface.KernelPath.TORCH_LSTM
    assert str(lstm) == f"{lstm}" == lstm == "torch-lstm" and json.dumps(lstm) == '"torch-lstm"'
    assert interface.KernelPath.torch("gru").torch_kind == "gru"
    assert interface.KernelPath.SCAN.on_triton is interface.KernelPath.TRITON_SCAN


def test_call_descriptions_are_checked():
    with pytest.raises(TypeError, match="unknown call description"):
        Call.of(devce_type="cuda")
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
    for path in sorted(KERNELS.rglob("*.py")):
        for window, lineno in _windows(path, 6):
            seen[window].append(f"{path.relative_to(KERNELS)}:{lineno}")
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
