"""The cell registry: names, aliases, presets, errors, plugins and `list cells` rows."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest
import torch

from lstmablate.cells import Cell, available_cells, build_encoder, get_cell, register_cell
from lstmablate.cells import registry
from lstmablate.cells.describe import cell_rows, describe_cell
from lstmablate.errors import ConfigError, UnknownNameError, UserError


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register freely inside a test: the registry is restored afterwards."""
    registry._load_plugins()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))
    return registry


class _Tanh(Cell):
    """A toy cell: h_t = tanh(W x_t + U h_{t-1})."""

    def __init__(self, input_size, hidden_size, gain: float = 1.0):
        super().__init__(input_size, hidden_size)
        self.gain = gain
        self.w = torch.nn.Parameter(torch.randn(hidden_size, input_size))
        self.u = torch.nn.Parameter(torch.randn(hidden_size, hidden_size))

    def project_inputs(self, x):
        return x @ self.w.t()

    def step(self, xp, state, h_mask):
        h = torch.tanh(self.gain * (xp + state[0] @ self.u.t()))
        return h, (h,)


def test_names_and_aliases():
    names = available_cells()
    assert names == sorted(names)
    assert "srnn" not in names  # aliases are not separate cells
    assert get_cell("srnn") is get_cell("lstm-gates")
    spec = get_cell("lstm-srnn-out")
    assert spec.preset == {"content": "linear", "output_gate": False}
    assert spec.family == "lstm" and spec.summary and spec.equations


def test_unknown_name_says_did_you_mean():
    with pytest.raises(UnknownNameError) as err:
        get_cell("lstm_srnn")
    msg = str(err.value)
    assert "Did you mean 'lstm-srnn'?" in msg
    assert "mmlstm" in msg and "list cells" in msg
    assert isinstance(err.value, UserError) and isinstance(err.value, KeyError)
    with pytest.raises(UnknownNameError, match="Did you mean 'gru'"):
        build_encoder("gur", 3, 4)


def test_unknown_option_says_did_you_mean():
    with pytest.raises(UnknownNameError, match="Did you mean 'output_gate'"):
        build_encoder("lstm", 3, 4, outptu_gate=False)


def test_presets_cannot_be_overridden():
    with pytest.raises(ConfigError, match="fixes option") as err:
        build_encoder("lstm-srnn", 3, 4, content="srnn")
    assert "choose another cell name" in str(err.value)
    with pytest.raises(ConfigError, match="memory_cell"):
        build_encoder("srnn", 3, 4, memory_cell=True)
    # a free option of the same class is fine
    build_encoder("lstm-srnn", 3, 4, output_gate=False)


def test_option_names_are_introspected():
    assert {"num_matrices", "forget_matrices", "bias"} <= get_cell("mmlstm").option_names()
    assert get_cell("gru").option_names() == {"reset_after", "forget_bias", "init_scale"}


def test_duplicates_rejected(scratch_registry):
    with pytest.raises(ValueError, match="already registered"):
        register_cell("lstm", family="toy", summary="x")(_Tanh)
    with pytest.raises(ValueError, match="already registered"):
        register_cell("toy-new", family="toy", summary="x", aliases=("srnn",))(_Tanh)
    assert "toy-new" not in registry._REGISTRY
    with pytest.raises(TypeError, match="Cell subclass"):
        register_cell("toy-bad", family="toy", summary="x")(object)


def test_register_and_build_a_new_cell(scratch_registry):
    register_cell("toy", family="toy", summary="h=tanh(g(Wx+Uh'))", aliases=("toy-alias",))(_Tanh)
    register_cell("toy-hot", family="toy", summary="gain 3", gain=3.0)(_Tanh)
    enc = build_encoder("toy-alias", 3, 4, num_layers=2, bidirectional=True)
    out, (h,) = enc(torch.randn(2, 5, 3), lengths=torch.tensor([5, 2]))
    assert out.shape == (2, 5, 8) and h.shape == (4, 2, 4)
    assert enc.layers[0][0].gain == 1.0
    assert build_encoder("toy-hot", 3, 4).layers[0][0].gain == 3.0
    with pytest.raises(ConfigError, match="fixes option"):
        build_encoder("toy-hot", 3, 4, gain=2.0)
    assert not get_cell("toy").memory_cell
    row = describe_cell("toy")
    assert row.aliases == ("toy-alias",) and row.params == 650 * 650 * 2
    assert row.options == ("gain",)


def _fake_entry_points(eps):
    def entry_points(group=None, **kw):
        return [ep for ep in eps if group is None or ep.group == group]
    return entry_points


def test_entry_point_module_plugin(scratch_registry, monkeypatch, tmp_path):
    mod = tmp_path / "lstmablate_fake_cells_plugin.py"
    mod.write_text(textwrap.dedent('''
        import torch
        from lstmablate.cells import Cell, register_cell

        @register_cell("plugin-identity", family="plugin", summary="h = W x", bidirectional=False)
        class Identity(Cell):
            def __init__(self, input_size, hidden_size):
                super().__init__(input_size, hidden_size)
                self.w = torch.nn.Parameter(torch.eye(hidden_size, input_size))
            def project_inputs(self, x):
                return x @ self.w.t()
            def step(self, xp, state, h_mask):
                return xp, (xp,)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lstmablate_fake_cells_plugin", raising=False)
    eps = [EntryPoint("fake", "lstmablate_fake_cells_plugin", registry.ENTRY_POINT_GROUP),
           EntryPoint("other-group", "nonexistent_module_xyz", "some.other.group")]
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(eps))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    assert "plugin-identity" in available_cells()
    enc = build_encoder("plugin-identity", 3, 3)
    x = torch.randn(1, 4, 3)
    torch.testing.assert_close(enc(x)[0], x)
    with pytest.raises(ConfigError, match="bidirectionally"):
        build_encoder("plugin-identity", 3, 3, bidirectional=True)
    assert "plugin-identity" in [r.name for r in cell_rows()]


def test_entry_point_callable_plugin_and_broken_plugin(scratch_registry, monkeypatch, tmp_path):
    mod = tmp_path / "lstmablate_fake_cells_plugin2.py"
    mod.write_text(textwrap.dedent('''
        CALLED = []
        def register():
            import torch
            from lstmablate.cells import Cell, register_cell

            @register_cell("plugin-tanh", family="plugin", summary="h = tanh(W x)")
            class Tanh(Cell):
                def __init__(self, input_size, hidden_size):
                    super().__init__(input_size, hidden_size)
                    self.w = torch.nn.Parameter(torch.randn(hidden_size, input_size))
                def project_inputs(self, x):
                    return x @ self.w.t()
                def step(self, xp, state, h_mask):
                    return torch.tanh(xp), (torch.tanh(xp),)
            CALLED.append(1)
    '''))
    bad = tmp_path / "lstmablate_fake_broken_plugin.py"
    bad.write_text("raise ImportError('missing dependency foo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("lstmablate_fake_cells_plugin2", "lstmablate_fake_broken_plugin"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    eps = [EntryPoint("broken", "lstmablate_fake_broken_plugin", registry.ENTRY_POINT_GROUP),
           EntryPoint("fn", "lstmablate_fake_cells_plugin2:register", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(eps))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.warns(RuntimeWarning, match="'broken'.*missing dependency foo"):
        names = available_cells()
    assert "plugin-tanh" in names and "lstm" in names
    assert sys.modules["lstmablate_fake_cells_plugin2"].CALLED == [1]
    available_cells()  # loaded once only
    assert sys.modules["lstmablate_fake_cells_plugin2"].CALLED == [1]


def test_capabilities_are_declared():
    assert not get_cell("dyck-rnn").bidirectional
    assert all(get_cell(n).bidirectional for n in available_cells() if n != "dyck-rnn")
    assert get_cell("lstm").memory_cell and not get_cell("lstm-gates").memory_cell
    assert get_cell("dyck-rnn").memory_cell is False  # built at its example sizes (1, 4)


def test_list_cells_rows():
    rows = {r.name: r for r in cell_rows()}
    assert set(rows) == set(available_cells())
    H = 650
    assert rows["lstm"].params == 4 * H * (2 * H) + 4 * H
    assert rows["lstm-srnn"].params == 3 * H * 2 * H + H * H + 3 * H  # content W_cx only, no b_c
    assert rows["lstm-srnn-hidden-out"].params == 3 * H * H + 2 * H
    assert rows["lstm-gates"].params == H * 2 * H + H
    assert rows["gru"].params == 3 * H * 2 * H + 3 * H
    assert rows["mrnn"].params == 4 * H * H + H
    assert rows["mlstm"].params == H * H + 4 * H * H + H * H + 4 * H * H + 4 * H
    assert rows["mmrnn"].params == 4 * (4 + 2 * H) + 4 * H * H + H * H
    assert rows["mmlstm"].params == 4 * (4 * (4 + 2 * H) + 4 * H * H + H * H)
    assert rows["dyck-rnn"].params == 5 and rows["dyck-rnn"].params_at == (1, 4)
    assert rows["lstm-gates"].aliases == ("srnn",)
    assert rows["lstm"].proj_size and not rows["lstm-gates"].proj_size and not rows["gru"].proj_size
    assert rows["lstm"].memory_cell and rows["gru"].memory_cell and not rows["mmrnn"].memory_cell
    assert "weighted-sum" in rows["lstm"].supports and rows["dyck-rnn"].supports == "fast path"
    assert "content" not in rows["lstm-srnn"].options  # preset, not settable
    assert rows["lstm"].as_dict()["name"] == "lstm"
    # the 4.5M of the report's Table 2: mmLSTM h = 512 with 128-d character embeddings
    from lstmablate.cells.describe import count_parameters
    assert round(count_parameters(get_cell("mmlstm"), 128, 512) / 1e6, 1) == 4.5
