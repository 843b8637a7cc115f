"""Second-order cells: input-dependent hidden-to-hidden transitions.

Sources: Renganathan & Singh, *Second-order RNNs: Resurgence of Recurrence*
(*Second-order RNNs: Resurgence of Recurrence*, "R&S" below) and the original papers of
mRNN and mLSTM (Sutskever, Martens & Hinton 2011; Krause et al. 2016).

mrnn — multiplicative RNN (Sutskever, Martens & Hinton 2011)
    m_t = (W_mx x_t) * (W_mh h_{t-1})
    h_t = tanh(W_hm m_t + W_hx x_t + b_h)
  i.e. the transition matrix W_hm diag(W_mx x_t) W_mh depends on x_t.

mlstm — multiplicative LSTM (Krause et al. 2016)
    m_t = (W_mx x_t) * (W_mh h_{t-1})
    [i; f; o; u] = W_x x_t + W_hm m_t + b       (m_t replaces h_{t-1} in all four)
    i, f, o = sigma(.), u = tanh(.)
    c_t = f_t * c_{t-1} + i_t * u_t;  h_t = o_t * tanh(c_t)

mmrnn — multi-matrix RNN (R&S eqs 6-8)
    v_t   = softmax(W^proj [v_{t-1}; h_{t-1}; x_t])          (6)  key vector, K entries
    W^hh_t = sum_{i=1..K} v_t[i] W[i]                         (7)  K choice matrices
    h_t   = tanh(W^hh_t h_{t-1} + W^hx x_t)                  (8)

mmlstm — multi-matrix LSTM (R&S eqs 9-22): one key vector, one projection and
one set of choice matrices per block g in {c^, i, f, o}:
    v_g,t   = softmax(W_g^proj [v_g,t-1; h_{t-1}; x_t])       (9, 11, 13, 15)
    W_g^hh_t = sum_j v_g,t[j] W_g[j]                          (10, 12, 14, 16)
    i, f, o = sigma(W_g^hh_t h_{t-1} + W_g^hx x_t)            (17-19)
    c^_t    = tanh(W_c^hh_t h_{t-1} + W_c^hx x_t)             (20)
    c_t = f_t * c_{t-1} + i_t * c^_t;  h_t = o_t * tanh(c_t)  (21, 22)

Notes on the report (R&S), and the choices made here:

* **Number of choice matrices per gate.**  §4.3 fixes K = 4 "through empirical
  analysis", and eqs 10 and 12 sum over j = 1..4, but eq 14 (forget gate) sums
  over j = 1..2 and eq 16 (output gate) over j = 1..T (a typesetting slip).  The
  parameter counts of Table 1/2 decide it: at h = 512 with 128-d character
  embeddings, four matrices in every block give 4 x (4*512^2 + 512*128 +
  4*(4+512+128)) = 4.47M parameters (the "4.5M" of Table 2), while K_f = 2
  would give 3.94M.  So K = 4 for every block by default; ``num_matrices``
  changes all four, and ``input_matrices``, ``forget_matrices``,
  ``output_matrices``, ``content_matrices`` override one block each
  (``forget_matrices=2`` is eq 14 as printed).
* **Biases.**  Eqs 6, 8 and 9-20 print no bias terms, so the default
  ``bias=False`` is the equations as printed; ``bias=True`` adds a bias to every
  pre-activation (the W^hx x_t terms and the key projections).  ``forget_bias``
  (the initial b_f) therefore needs ``bias=True`` for mmlstm.
* **Initial key vector.**  "initialized to give equal weight to all the 4
  choice matrices": v_0 = 1/K in every entry; the key vectors are part of the
  recurrent state (state names ``key`` / ``key_i`` ...), so they are carried
  across batches and padding like h and c.
* **Order within a step.**  Eq 7 builds W^hh_t from v_t (the *new* key), which
  eq 6 computes from h_{t-1}; W^hh_t then multiplies h_{t-1}.
* The report's "equivalent operations" optimisation is used: W^hh_t h_{t-1} =
  sum_i v_t[i] (W[i] h_{t-1}), and all W[i] h_{t-1} come from one matrix product
  with the stacked choice matrices, so no per-example H x H matrix is built.
* mRNN and mLSTM have a factor size F = ``factor_size`` (the "m" of Table 1,
  default F = H as in the report's "h = m" rows).  Table 1's parameter counts
  for these two rows do not match either formula; we follow the original
  papers (Sutskever et al. 2011; Krause et al. 2016).  Krause et al. initialise b_f to 1 (``forget_bias=1``);
  our default leaves it uniform like every other parameter.

Initialisation (every cell here): all parameters uniform(±1/sqrt(H)) as
``torch.nn.LSTM``, or uniform(±init_scale) when given; then b_f = forget_bias
if set.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError

from ._memory import MemoryTraceMixin
from .base import Cell, FastKernels, State
from .registry import register_cell


def _check_positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


# ---------------------------------------------------------------------------------
# mRNN and mLSTM: a factored, input-dependent transition
# ---------------------------------------------------------------------------------

class _FactoredCell(Cell):
    """Shared layout: ``weight_ih`` = [W_mx; W_x...] (F + n*H rows), ``weight_mh``
    (F x H), ``weight_hm`` (n*H x F), ``bias`` (n*H)."""

    n_blocks = 1

    def __init__(self, input_size: int, hidden_size: int, factor_size: int | None):
        super().__init__(input_size, hidden_size)
        F = hidden_size if factor_size is None else _check_positive("factor_size", factor_size)
        self.factor_size = F
        nH = self.n_blocks * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(F + nH, input_size))  # [W_mx; W_x]
        self.weight_mh = nn.Parameter(torch.empty(F, hidden_size))  # W_mh
        self.weight_hm = nn.Parameter(torch.empty(nH, F))  # W_hm
        self.bias = nn.Parameter(torch.empty(nH))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, factor_size={self.factor_size}"

    def project_inputs(self, x: Tensor) -> Tensor:
        """[W_mx x_t, W_x x_t + b] for every step: one matrix product."""
        xp = x @ self.weight_ih.t()
        F = self.factor_size
        return torch.cat([xp[..., :F], xp[..., F:] + self.bias], dim=-1)

    def _recurrent(self, xp: Tensor, h_prev: Tensor, h_mask: Tensor | None) -> Tensor:
        F = self.factor_size
        hh = h_prev if h_mask is None else h_prev * h_mask
        m = xp[..., :F] * (hh @ self.weight_mh.t())  # m_t = (W_mx x_t) * (W_mh h_{t-1})
        return xp[..., F:] + m @ self.weight_hm.t()  # W_x x_t + W_hm m_t + b


@register_cell("mrnn", family="multiplicative",
               equations="Sutskever et al. 2011 (R&S §3)",
               summary="m=(W_mx x)∘(W_mh h'); h=tanh(W_hm m+W_hx x+b)")
class MRNNCell(_FactoredCell):
    """Multiplicative RNN: h_t = tanh(W_hm ((W_mx x_t) * (W_mh h_{t-1})) + W_hx x_t + b)."""

    fast_kernels = FastKernels("lstmablate.cells.kernels.second_order.factored",
                               math=("step", "_recurrent", "project_inputs"))

    def __init__(self, input_size: int, hidden_size: int, factor_size: int | None = None,
                 init_scale: float | None = None):
        super().__init__(input_size, hidden_size, factor_size)
        self.reset_parameters(init_scale)

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        h = torch.tanh(self._recurrent(xp, state[0], h_mask))  # h_t = tanh(W_hm m_t + W_hx x_t + b)
        return h, (h,)


@register_cell("mlstm", family="multiplicative",
               equations="Krause et al. 2016 (R&S §3)",
               summary="m=(W_mx x)∘(W_mh h'); i,f,o,u from W_x x+W_hm m+b; c=f∘c'+i∘u; h=o∘tanh(c)")
class MLSTMCell(MemoryTraceMixin, _FactoredCell):
    """Multiplicative LSTM: m_t replaces h_{t-1} in all four pre-activations.

    Blocks in ``weight_ih[F:]``, ``weight_hm`` and ``bias``: i, f, o, u.
    """

    n_blocks = 4
    state_names = ("h", "c")
    memory_index = 1
    fast_kernels = FastKernels("lstmablate.cells.kernels.second_order.factored",
                               math=("step", "memory_step", "_recurrent", "project_inputs"))

    def __init__(self, input_size: int, hidden_size: int, factor_size: int | None = None,
                 forget_bias: float | None = None, init_scale: float | None = None):
        super().__init__(input_size, hidden_size, factor_size)
        self.forget_bias = forget_bias
        self.reset_parameters(init_scale)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.hidden_size)

    def reset_parameters(self, init_scale: float | None = None) -> None:
        super().reset_parameters(init_scale)
        if self.forget_bias is not None:
            H = self.hidden_size
            with torch.no_grad():
                self.bias[H:2 * H].fill_(self.forget_bias)

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        h_prev, c_prev = state
        zi, zf, zo, zu = self._recurrent(xp, h_prev, h_mask).split(self.hidden_size, dim=-1)
        i, f, o = torch.sigmoid(zi), torch.sigmoid(zf), torch.sigmoid(zo)  # gates from x_t, m_t
        u = torch.tanh(zu)  # content from x_t, m_t
        c = f * c_prev + i * u  # c_t = f_t * c_{t-1} + i_t * u_t
        h = o * torch.tanh(c)  # h_t = o_t * tanh(c_t)
        return h, (h, c), i, f, u


# ---------------------------------------------------------------------------------
# mmRNN and mmLSTM: a key vector chooses a mixture of K matrices (R&S eqs 6-22)
# ---------------------------------------------------------------------------------

class _MultiMatrixCell(Cell):
    """Shared machinery for eqs 6-8 / 9-20: blocks g, each with K_g choice matrices.

    Parameter layout (blocks in the order of ``self.blocks``; K = sum_g K_g):

    * ``weight_ih`` (K + n*H, I): the x-columns of every W_g^proj, then every W_g^hx;
    * ``weight_hh`` (K + sum_g K_g*H, H): the h-columns of every W_g^proj, then the
      choice matrices W_g[1..K_g] stacked (row block j*H.. of block g is W_g[j]);
    * ``key_weights[b]`` (K_g, K_g): the v-columns of W_g^proj (the key's own
      recurrence), one parameter per block since the K_g may differ;
    * ``bias`` (K + n*H) if ``bias``: key biases, then pre-activation biases.

    :meth:`key_projection`, :meth:`choice_matrices` and :meth:`input_matrix`
    assemble the matrices of the equations from this layout.
    """

    blocks: tuple[str, ...] = ("h",)

    def __init__(self, input_size: int, hidden_size: int, num_matrices: dict[str, int],
                 bias: bool):
        super().__init__(input_size, hidden_size)
        H, I = hidden_size, input_size
        self.num_matrices = {g: _check_positive(f"number of choice matrices ({g})", num_matrices[g])
                             for g in self.blocks}
        Ks = [self.num_matrices[g] for g in self.blocks]
        self._K_total = sum(Ks)
        n = len(self.blocks)
        self.weight_ih = nn.Parameter(torch.empty(self._K_total + n * H, I))
        self.weight_hh = nn.Parameter(torch.empty(self._K_total + sum(Ks) * H, H))
        self.key_weights = nn.ParameterList(nn.Parameter(torch.empty(k, k)) for k in Ks)
        self.bias = nn.Parameter(torch.empty(self._K_total + n * H)) if bias else None
        # offsets of each block's key rows and choice rows
        self._key_off = [sum(Ks[:b]) for b in range(n)]
        self._choice_off = [self._K_total + sum(Ks[:b]) * H for b in range(n)]

    # -- description -------------------------------------------------------------
    def initial_state(self, batch: int, like: Tensor) -> State:
        """h_0 (and c_0) = 0; every key v_0 = 1/K: equal weight on the K matrices (§4.3)."""
        zeros = tuple(like.new_zeros(batch, n) for n in self.state_sizes[:self._n_plain])
        keys = tuple(like.new_full((batch, self.num_matrices[g]), 1.0 / self.num_matrices[g])
                     for g in self.blocks)
        return zeros + keys

    _n_plain = 1  # number of state components before the keys (h; or h, c)

    def extra_repr(self) -> str:
        ks = ", ".join(f"{g}={k}" for g, k in self.num_matrices.items())
        return f"{self.input_size}, {self.hidden_size}, matrices=({ks}), bias={self.bias is not None}"

    def key_projection(self, block: str) -> Tensor:
        """W_g^proj as printed: (K_g, K_g + H + I), columns [v; h; x]."""
        b = self.blocks.index(block)
        k, o = self.num_matrices[block], self._key_off[b]
        return torch.cat([self.key_weights[b], self.weight_hh[o:o + k],
                          self.weight_ih[o:o + k]], dim=1)

    def choice_matrices(self, block: str) -> Tensor:
        """W_g[1..K_g] as a (K_g, H, H) tensor."""
        b = self.blocks.index(block)
        k, o, H = self.num_matrices[block], self._choice_off[b], self.hidden_size
        return self.weight_hh[o:o + k * H].view(k, H, H)

    def input_matrix(self, block: str) -> Tensor:
        """W_g^hx: (H, I)."""
        b, H = self.blocks.index(block), self.hidden_size
        o = self._K_total + b * H
        return self.weight_ih[o:o + H]

    # -- computation ----------------------------------------------------------------
    def project_inputs(self, x: Tensor) -> Tensor:
        """x-columns of every key projection and every W_g^hx x_t (+ biases): one product."""
        xp = x @ self.weight_ih.t()
        return xp if self.bias is None else xp + self.bias

    def _mixed(self, xp: Tensor, h_prev: Tensor, keys: State, h_mask: Tensor | None
               ) -> tuple[list[Tensor], list[Tensor]]:
        """Per block: the new key v_g,t and the pre-activation W_g^hh_t h_{t-1} + W_g^hx x_t."""
        H, K = self.hidden_size, self._K_total
        hh = h_prev if h_mask is None else h_prev * h_mask
        rec = hh @ self.weight_hh.t()  # h-columns of W^proj, and every W_g[j] h_{t-1}
        B = h_prev.shape[0]
        new_keys, pre = [], []
        for b, g in enumerate(self.blocks):
            k, ko = self.num_matrices[g], self._key_off[b]
            logits = xp[..., ko:ko + k] + rec[..., ko:ko + k] + keys[b] @ self.key_weights[b].t()
            v = torch.softmax(logits, dim=-1)  # eqs 6 / 9, 11, 13, 15
            co = self._choice_off[b]
            Wh = rec[..., co:co + k * H].view(B, k, H)  # W_g[j] h_{t-1} for j = 1..K_g
            mixed = torch.einsum("bk,bkh->bh", v, Wh)  # eqs 7 / 10, 12, 14, 16: (sum_j v[j] W[j]) h
            po = K + b * H
            pre.append(mixed + xp[..., po:po + H])  # + W_g^hx x_t (eqs 8 / 17-20)
            new_keys.append(v)
        return pre, new_keys


@register_cell("mmrnn", family="multiplicative", equations="Renganathan & Singh eqs 6-8",
               summary="v=softmax(W_p[v';h';x]); W_hh=Σ_i v_i W_i (K=4); h=tanh(W_hh h'+W_hx x)")
class MMRNNCell(_MultiMatrixCell):
    """Multi-matrix RNN (R&S eqs 6-8); state (h, key).

    ``num_matrices`` is K (default 4, §4.3); ``bias`` adds biases the equations
    do not print (default off).
    """

    blocks = ("h",)
    state_names = ("h", "key")
    fast_kernels = FastKernels("lstmablate.cells.kernels.second_order.multi_matrix",
                               math=("step", "_mixed", "project_inputs"))

    def __init__(self, input_size: int, hidden_size: int, num_matrices: int = 4,
                 bias: bool = False, init_scale: float | None = None):
        super().__init__(input_size, hidden_size, {"h": num_matrices}, bias)
        self.reset_parameters(init_scale)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.num_matrices["h"])

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        h_prev, key = state
        (pre,), (v,) = self._mixed(xp, h_prev, (key,), h_mask)
        h = torch.tanh(pre)  # eq 8
        return h, (h, v)


@register_cell("mmlstm", family="multiplicative", equations="Renganathan & Singh eqs 9-22",
               summary="per gate g: v_g=softmax(W_g[v_g';h';x]), W_g,hh=Σ_j v_g,j W_g,j (K=4); LSTM gates")
class MMLSTMCell(MemoryTraceMixin, _MultiMatrixCell):
    """Multi-matrix LSTM (R&S eqs 9-22); state (h, c, key_i, key_f, key_o, key_c).

    Blocks in order i, f, o, c (the content c^ last, as in ``lstm.py``).
    ``num_matrices`` sets K for every block (default 4); ``input_matrices``,
    ``forget_matrices``, ``output_matrices``, ``content_matrices`` override
    one block each (eq 14 as printed is ``forget_matrices=2``; see the module
    docstring).  ``bias`` adds the biases the equations do not print;
    ``forget_bias`` (needs ``bias=True``) initialises b_f.
    """

    blocks = ("i", "f", "o", "c")
    state_names = ("h", "c", "key_i", "key_f", "key_o", "key_c")
    _n_plain = 2
    memory_index = 1
    fast_kernels = FastKernels("lstmablate.cells.kernels.second_order.multi_matrix",
                               math=("step", "memory_step", "_mixed", "project_inputs"))

    def __init__(self, input_size: int, hidden_size: int, num_matrices: int = 4,
                 input_matrices: int | None = None, forget_matrices: int | None = None,
                 output_matrices: int | None = None, content_matrices: int | None = None,
                 bias: bool = False, forget_bias: float | None = None,
                 init_scale: float | None = None):
        _check_positive("num_matrices", num_matrices)
        per = {"i": input_matrices, "f": forget_matrices, "o": output_matrices,
               "c": content_matrices}
        super().__init__(input_size, hidden_size,
                         {g: num_matrices if k is None else k for g, k in per.items()}, bias)
        if forget_bias is not None and not bias:
            raise ConfigError("mmlstm: forget_bias initialises b_f, which exists only with "
                              "bias=True (eqs 9-20 print no biases)")
        self.forget_bias = forget_bias
        self.reset_parameters(init_scale)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        H = self.hidden_size
        return (H, H) + tuple(self.num_matrices[g] for g in self.blocks)

    def reset_parameters(self, init_scale: float | None = None) -> None:
        super().reset_parameters(init_scale)
        if self.forget_bias is not None and self.bias is not None:
            H, o = self.hidden_size, self._K_total + self.blocks.index("f") * self.hidden_size
            with torch.no_grad():
                self.bias[o:o + H].fill_(self.forget_bias)

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        h_prev, c_prev, *keys = state
        (zi, zf, zo, zc), new_keys = self._mixed(xp, h_prev, keys, h_mask)
        i = torch.sigmoid(zi)  # eq 17
        f = torch.sigmoid(zf)  # eq 18
        o = torch.sigmoid(zo)  # eq 19
        c_hat = torch.tanh(zc)  # eq 20
        c = f * c_prev + i * c_hat  # eq 21
        h = o * torch.tanh(c)  # eq 22
        return h, (h, c, *new_keys), i, f, c_hat
