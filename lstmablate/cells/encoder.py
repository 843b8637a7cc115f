"""Stacking, bidirectionality, masking, dropout and state handling.

Any registered :class:`~lstmablate.cells.base.Cell` becomes a full encoder
here, so every cell gets the same options:

* ``num_layers`` stacked layers (equation 60 of the Neubig notes, 003);
* ``dropout`` between layers, on the non-recurrent connections only (as in
  Zaremba et al. 2014: what layer l emits is dropped before layer l+1 reads it;
  the last layer's output is left to the task, like ``torch.nn.LSTM``); fresh
  per position by default, one mask per sequence with ``variational_dropout``
  (Gal & Ghahramani 2016; Parser-v1's same-mask dropout);
* ``recurrent_dropout``: variational dropout on h_{t-1} where it enters the
  recurrent products (one mask per sequence, Gal & Ghahramani 2016);
* ``residual``: x_t is added to a layer's output whenever the sizes agree
  (equation 61 of 003); the recurrent state itself is not changed;
* ``bidirectional``: the backward cell reads each sequence reversed *within
  its own length*, so it starts at that sequence's last real token;
* ``lengths``: padded positions produce zero outputs and never change the
  state, so each sequence's outputs and final state equal those of running it
  alone;
* ``layer_mix="scalar"``: the outputs are ELMo's γ · Σ_j softmax(s)_j h_j over the layers
  (optionally the input too, ``layer_mix_input``) instead of the top layer's; and
  ``pooling`` (``max | mean | last``): what :meth:`Encoder.pool` / :meth:`Encoder.encode`
  make of a sequence's outputs, over its real positions only — both in
  :mod:`lstmablate.cells.pooling`, equations there.

State layout follows ``torch.nn.LSTM``: a tuple with one tensor per state
component (``h`` first, then e.g. ``c``), each ``(num_layers * directions, B, size)``
ordered layer-major (layer 0 forward, layer 0 backward, layer 1 forward, ...).

What an encoder gives a task (the cell contract, seen from outside):

* ``enc(x, lengths=None, state=None, masks=None) -> (outputs, final_state)``: a
  whole (padded) batch of sequences;
* the **step API**, for decoders that feed each output back in (NMT input
  feeding) and for beam search — unidirectional encoders only::

      state = enc.initial_state(B, like=x)   # zeros, the layout above
      masks = enc.sample_masks(B, like=x)    # dropout masks fixed for a whole sequence
      for t in range(T):
          out_t, state = enc.step(x[:, t], state, masks)   # one token, all layers
      state = enc.reorder_state(state, index)              # beam search

  Stepping T times with ``masks`` gives exactly ``enc(x, masks=masks)``: the same
  recurrent products (each cell's reference ``project_inputs`` + ``step``), the
  same recurrent-dropout masks.  Between-layer ``dropout`` is drawn afresh for
  every token (as ``enc(x)`` draws it afresh for every position) unless the
  encoder has ``variational_dropout=True``, which uses one mask per sequence
  (held in ``masks``) in both APIs.

Sentence vectors (an encoder built with ``pooling`` other than ``none``; ``forward`` and
``step`` are unchanged by it)::

      vec = enc.encode(x, lengths)           # (B, output_size), e.g. BiLSTM-max
      vec = enc.pool(outputs, lengths)       # the same from outputs of enc(x, lengths)

What a cell must provide to be stepped: ``project_inputs`` and ``step`` (see
:class:`~lstmablate.cells.base.Cell`), which every cell's reference loop already
uses; a fast sequence kernel is optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError, check_choice

from .base import Cell, NoMemoryCellError, State, weighted_sum
from .kernels.switches import reference_forced, reference_mode
from .pooling import LAYER_MIXES, POOLINGS, ScalarMix, pool

if TYPE_CHECKING:
    from .registry import CellSpec


def capturing(x: Tensor) -> bool:
    """Is a CUDA graph recording on ``x``'s device (``train.step_capture=graphs``)?  Then
    nothing may be read back to the host: with lengths, the encoder runs the masked reference
    loops (the padding-free fast paths plan their steps from the lengths on the host)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def lengths_to_mask(lengths: Tensor, T: int) -> Tensor:
    """(B,) lengths -> (T, B) float mask, 1 for real tokens."""
    steps = torch.arange(T, device=lengths.device).unsqueeze(1)
    return (steps < lengths.unsqueeze(0)).float()


def reverse_padded(x: Tensor, lengths: Tensor | None) -> Tensor:
    """Reverse each sequence of time-major ``x`` (T, B, ...) within its length.

    Padding stays where it is, so reversing twice is the identity.  One ``index_select`` of
    the (T * B) positions: its backward keeps only the index, not ``x`` (``gather`` would
    keep the whole padded input of every backward direction for the backward pass).
    """
    if lengths is None:
        return x.flip(0)
    T, B = x.shape[0], x.shape[1]
    t = torch.arange(T, device=x.device).unsqueeze(1)  # (T, 1)
    L = lengths.to(x.device).unsqueeze(0)  # (1, B)
    src = torch.where(t < L, L - 1 - t, t) * B + torch.arange(B, device=x.device)  # (T, B)
    return x.reshape(T * B, *x.shape[2:]).index_select(0, src.view(-1)).view(x.shape)


@dataclass
class StepMasks:
    """Dropout masks held fixed for a whole sequence (Gal & Ghahramani 2016).

    ``recurrent[k]``: the mask on h_{t-1} of cell k (layer-major, as the state
    layout), (B, output_size), already scaled by 1/(1-p); None where there is no
    recurrent dropout (or in eval mode).  ``between[l]``: with
    ``variational_dropout``, the mask on what layer l reads (l >= 1), (B, size);
    None otherwise.
    """

    recurrent: list[Tensor | None]
    between: list[Tensor | None]

    def reorder(self, index: Tensor) -> StepMasks:
        """The masks of the batch rows ``index`` (e.g. after a beam-search step)."""
        pick = lambda m: None if m is None else m.index_select(0, index)  # noqa: E731
        return StepMasks([pick(m) for m in self.recurrent], [pick(m) for m in self.between])


class Encoder(nn.Module):
    """A stack of cells, optionally bidirectional, that handles padding."""

    def __init__(
        self,
        spec: CellSpec,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        residual: bool = False,
        batch_first: bool = True,
        variational_dropout: bool = False,
        pooling: str = "none",
        layer_mix: str = "none",
        layer_mix_input: bool = False,
        **cell_options: Any,
    ):
        super().__init__()
        check_choice("pooling", pooling, POOLINGS)
        check_choice("layer_mix", layer_mix, LAYER_MIXES)
        if num_layers < 1:
            raise ConfigError(f"num_layers must be at least 1, got {num_layers}")
        for name, p in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {p}")
        self.cell_name = spec.name
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers = num_layers
        self.num_directions = 2 if bidirectional else 1
        self.bidirectional = bidirectional
        self.dropout, self.recurrent_dropout = dropout, recurrent_dropout
        self.residual, self.batch_first = residual, batch_first
        self.variational_dropout = variational_dropout
        layers = []
        size = input_size
        for _ in range(num_layers):
            cells = nn.ModuleList(spec.build(size, hidden_size, **cell_options)
                                  for _ in range(self.num_directions))
            layers.append(cells)
            size = cells[0].output_size * self.num_directions
        self.layers = nn.ModuleList(layers)
        self.output_size = size
        self.pooling = pooling
        self.layer_mix = layer_mix
        self.layer_mix_input = layer_mix_input
        self.mix: ScalarMix | None = None
        if layer_mix == "scalar":
            if layer_mix_input and input_size not in (size, size // self.num_directions):
                raise ConfigError(
                    f"layer_mix_input mixes the encoder's input with its layers' outputs, so the "
                    f"input size must equal the output size {size}"
                    + (" (or half of it, taken twice as ELMo's [x; x])" if bidirectional else "")
                    + f"; got {input_size}")
            self.mix = ScalarMix(num_layers + int(layer_mix_input))
        elif layer_mix_input:
            raise ConfigError("layer_mix_input needs layer_mix='scalar'")
        from .kernels.common import custom_ops

        custom_ops.register(self)  # one operator under torch.compile (forward)

    # -- introspection -------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return self.layers[0][0].state_names

    @property
    def has_memory_cell(self) -> bool:
        return self.layers[0][0].has_memory_cell

    def get_output_dim(self) -> int:
        return self.output_size

    def cells(self) -> list[Cell]:
        return [c for layer in self.layers for c in layer]

    def reset_parameters(self, init_scale: float | None = None) -> None:
        """Re-initialise every cell (uniform(±init_scale) when given; see each cell)."""
        for cell in self.cells():
            cell.reset_parameters(init_scale)
        if self.mix is not None:
            self.mix.reset_parameters()

    # -- forward ---------------------------------------------------------------
    def _prepare(self, x: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if x.dim() != 3:
            raise ValueError(f"encoder input must be 3-D (batch, time, features), got shape {tuple(x.shape)}")
        if self.batch_first:
            x = x.transpose(0, 1)
        T, B = x.shape[0], x.shape[1]
        mask = None
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=x.device).long()
            if lengths.shape != (B,):
                raise ValueError(f"lengths must have shape ({B},), got {tuple(lengths.shape)}")
            if capturing(x):  # no host read (the lengths were checked by the eager step)
                return x, lengths, lengths_to_mask(lengths, T).to(x.dtype)
            if B and (int(lengths.min()) < 0 or int(lengths.max()) > T):
                raise ValueError(f"lengths must lie in [0, {T}], got {lengths.tolist()}")
            if B and int(lengths.min()) == T:
                lengths = None  # nothing is padded: skip the masking work
            else:
                mask = lengths_to_mask(lengths, T).to(x.dtype)
        return x, lengths, mask

    def _split_state(self, state: State | None, B: int) -> list[State | None]:
        n = self.num_layers * self.num_directions
        if state is None:
            return [None] * n
        if isinstance(state, Tensor):
            state = (state,)
        names = self.state_names
        if len(state) != len(names):
            raise ValueError(f"cell {self.cell_name!r} has state {names}, got {len(state)} tensors")
        for s in state:
            if s.shape[0] != n or s.shape[1] != B:
                raise ValueError(
                    f"each state tensor must be (num_layers*directions={n}, batch={B}, size), "
                    f"got {tuple(s.shape)}")
        return [tuple(s[k] for s in state) for k in range(n)]

    def _h_mask(self, cell: Cell, B: int, like: Tensor) -> Tensor | None:
        return _dropout_mask(self.recurrent_dropout, self.training, B, cell.output_size, like)

    def _between_mask(self, B: int, size: int, like: Tensor) -> Tensor | None:
        if not self.variational_dropout:
            return None
        return _dropout_mask(self.dropout, self.training, B, size, like)

    def _drop_between(self, inp: Tensor, mask: Tensor | None) -> Tensor:
        """Dropout on what layer l >= 1 reads: one mask per sequence (variational) or fresh
        per element (``inp`` may be (T, B, size) or one step's (B, size))."""
        if self.variational_dropout:
            return inp if mask is None else inp * mask
        return nn.functional.dropout(inp, self.dropout, self.training)

    def _layer_input_sizes(self) -> list[int]:
        return [self.input_size] + [layer[0].output_size * self.num_directions
                                    for layer in self.layers[:-1]]

    def _like(self, like: Tensor | None) -> Tensor:
        if like is not None:
            return like
        for p in self.parameters():
            return p
        return torch.zeros(())

    # -- the step API (decoders, beam search) -------------------------------------
    def initial_state(self, batch: int, like: Tensor | None = None) -> State:
        """Each cell's own initial state (zeros for most; the second-order cells' keys start at
        1/K) in the state layout: one (num_layers * directions, B, size) tensor per state
        component, on ``like``'s device and dtype (default: the parameters').  It is the state
        ``forward`` and ``step`` start from when given none, so ``enc(x)`` equals
        ``enc(x, state=enc.initial_state(B))``."""
        like = self._like(like)
        per_cell = [cell.initial_state(batch, like) for cell in self.cells()]
        return tuple(torch.stack([s[k] for s in per_cell]) for k in range(len(per_cell[0])))

    def sample_masks(self, batch: int, like: Tensor | None = None) -> StepMasks:
        """The dropout masks of one batch of sequences: pass them to every ``step`` of
        those sequences (or to ``forward``) so dropout stays the same along a sequence.
        In eval mode, or without recurrent/variational dropout, every mask is None."""
        like = self._like(like)
        recurrent = [self._h_mask(cell, batch, like) for cell in self.cells()]
        sizes = self._layer_input_sizes()
        between = [None] + [self._between_mask(batch, sizes[li], like)
                            for li in range(1, self.num_layers)]
        return StepMasks(recurrent, between)

    def reorder_state(self, state: State, index: Tensor) -> State:
        """The states of batch rows ``index`` (beam search: which hypotheses survive)."""
        if isinstance(state, Tensor):
            state = (state,)
        return tuple(s.index_select(1, index) for s in state)

    def step(self, x_t: Tensor, state: State | None = None,
             masks: StepMasks | None = None) -> tuple[Tensor, State]:
        """One token through every layer: ``x_t`` (B, input_size) -> (output (B, output_size),
        new state).  Use the same ``masks`` (from :meth:`sample_masks`) for every step of a
        sequence; in training with recurrent or variational dropout they are required."""
        if self.bidirectional:
            raise ConfigError(
                f"step() reads one token at a time, left to right, but this {self.cell_name!r} "
                "encoder is bidirectional: its backward direction needs the whole sequence. "
                "Run it over the sequence with enc(x, lengths), or build it with "
                "bidirectional=False for a decoder.")
        if x_t.dim() != 2:
            raise ValueError(f"step() takes one token per sequence, (batch, features); got shape "
                             f"{tuple(x_t.shape)}")
        B = x_t.shape[0]
        if masks is None:
            needs = self.recurrent_dropout > 0 or (self.variational_dropout and self.dropout > 0)
            if self.training and needs:
                raise ValueError(
                    "step() in training mode needs the sequence's dropout masks: "
                    "masks = enc.sample_masks(batch) once per sequence, then "
                    "enc.step(x_t, state, masks) at every step (fresh masks at every step would "
                    "not be variational dropout).")
            masks = StepMasks([None] * len(self.cells()), [None] * self.num_layers)
        if state is None:
            state = self.initial_state(B, like=x_t)
        per_layer = self._split_state(state, B)
        finals: list[State] = []
        outs: list[Tensor] = []
        inp = x_t
        for li, layer in enumerate(self.layers):
            if li > 0 and self.dropout > 0:
                inp = self._drop_between(inp, masks.between[li])
            cell = layer[0]
            xp = cell.project_inputs(inp.unsqueeze(0))[0]
            out, new_state = cell.step(xp, per_layer[li], masks.recurrent[li])
            finals.append(new_state)
            if self.residual and out.shape[-1] == inp.shape[-1]:
                out = out + inp
            inp = out
            outs.append(out)
        if self.mix is not None:
            inp = self._mix(x_t, outs, None)
        return inp, tuple(torch.stack([f[k] for f in finals]) for k in range(len(finals[0])))

    def forward(
        self, x: Tensor, lengths: Tensor | None = None, state: State | None = None,
        masks: StepMasks | None = None,
    ) -> tuple[Tensor, State]:
        """Encode ``x``; returns ``(outputs, final_state)``.

        ``outputs``: (B, T, output_size) if batch_first else (T, B, output_size);
        zero at padded positions.  ``final_state``: a tuple (one tensor per
        state component) of shape (num_layers * directions, B, size).
        ``masks``: the dropout masks to use (from :meth:`sample_masks`); by
        default they are drawn for this call.  Under ``torch.compile`` the whole call is one
        operator, run as here (``kernels/common/custom_ops.py``).
        """
        if torch.compiler.is_compiling():  # torch.compile: the encoder is one operator
            from .kernels.common.custom_ops import encoder_call

            return encoder_call(self, x, lengths, state, masks)
        if lengths is not None and capturing(x) and not reference_forced():
            with reference_mode():  # a CUDA graph records the call: the masked loops
                return self.forward(x, lengths, state, masks)
        x, lengths, mask = self._prepare(x, lengths)
        B = x.shape[1]
        stacked = self._stacked(x, lengths, state, masks)
        if stacked is not None:  # the whole stack in one fused call
            out, final_state = stacked
            return (out.transpose(0, 1) if self.batch_first else out), final_state
        init = self._split_state(state, B)
        finals: list[State] = []
        layer_outputs: list[Tensor] = []
        inp = x
        sizes = self._layer_input_sizes()
        for li, layer in enumerate(self.layers):
            if li > 0 and self.dropout > 0:
                between = (masks.between[li] if masks is not None
                           else self._between_mask(B, sizes[li], x))
                inp = self._drop_between(inp, between)
            outs = []
            for d, cell in enumerate(layer):
                k = li * self.num_directions + d
                s0 = init[k]
                h_mask = masks.recurrent[k] if masks is not None else self._h_mask(cell, B, x)
                if d == 0:
                    out, fs = cell(inp, s0, mask, h_mask)
                else:
                    out, fs = cell(reverse_padded(inp, lengths), s0, mask, h_mask)
                    out = reverse_padded(out, lengths)
                outs.append(out)
                finals.append(fs)
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
            if self.residual and out.shape[-1] == inp.shape[-1]:
                out = out + inp
                if mask is not None:
                    out = out * mask.unsqueeze(-1)
            inp = out
            layer_outputs.append(out)
        if self.mix is not None:
            inp = self._mix(x, layer_outputs, mask)
        final_state = tuple(torch.stack([f[j] for f in finals]) for j in range(len(finals[0])))
        if self.batch_first:
            inp = inp.transpose(0, 1)
        return inp, final_state

    def _stacked(self, x: Tensor, lengths: Tensor | None, state: State | None,
                 masks: StepMasks | None) -> tuple[Tensor, State] | None:
        """The cells' kernel family may run the whole encoder in one call (cuDNN, where
        the options add nothing between the layers: ``KernelFamily.stack``); None: it
        runs layer by layer."""
        from .kernels.interface import family_of

        family = family_of(self.layers[0][0])
        if family is None or self.mix is not None:  # a layer mix needs every layer's output
            return None
        if lengths is not None and capturing(x):  # (it reads the lengths on the host)
            return None
        if isinstance(state, Tensor):
            state = (state,)
        if state is not None:
            self._split_state(state, x.shape[1])  # the same checks as the layer-by-layer path
        return family.stack(self, x, lengths, state, masks)

    def _mix(self, x: Tensor, layer_outputs: list[Tensor], mask: Tensor | None) -> Tensor:
        """ELMo's γ · Σ_j softmax(s)_j h_j (see :mod:`.pooling`); ``x`` is the encoder's input,
        layer 0 with ``layer_mix_input`` ([x; x] where the output is twice its size)."""
        layers = list(layer_outputs)
        if self.layer_mix_input:
            h0 = x if x.shape[-1] == self.output_size else torch.cat([x, x], dim=-1)
            if mask is not None:  # padding stays zero
                h0 = h0 * mask.unsqueeze(-1)
            layers.insert(0, h0)
        return self.mix(layers)

    # -- sentence vectors ---------------------------------------------------------
    def _require_pooling(self) -> None:
        if self.pooling == "none":
            raise ConfigError(
                f"this {self.cell_name!r} encoder was built with pooling='none'; build it with "
                "pooling='max', 'mean' or 'last' to get sentence vectors")

    def pool(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The ``pooling`` of this encoder (max | mean | last, over real positions only; see
        :mod:`.pooling`) applied to ``outputs`` of ``enc(x, lengths)`` -> (B, output_size)."""
        self._require_pooling()
        if self.batch_first:
            outputs = outputs.transpose(0, 1)
        return pool(outputs, lengths, self.pooling, self.bidirectional)

    def encode(self, x: Tensor, lengths: Tensor | None = None, state: State | None = None,
               masks: StepMasks | None = None) -> Tensor:
        """One vector per sequence: ``pool(enc(x, lengths, state, masks)[0], lengths)``."""
        self._require_pooling()
        out, _ = self(x, lengths, state, masks)
        return self.pool(out, lengths)

    # -- the weighted-sum view (equation 8) -------------------------------------
    @torch.no_grad()
    def weighted_sum(self, x: Tensor, lengths: Tensor | None = None) -> list[list[dict[str, Tensor]]]:
        """The memory cell as an element-wise weighted sum, per layer and direction.

        Returns ``result[layer][direction]`` = dict with ``weights`` (B, T, T, H)
        indexed [b, t, j] (zero where j > t), ``content`` (B, T, H) and
        ``memory`` (B, T, H), such that memory[:, t] = sum_j weights[:, t, j] * content[:, j].
        Positions are in reading order of that direction's cell: for the backward
        direction, index t counts from each sequence's last real token.
        Computed in eval mode (no dropout) from a zero initial state.
        """
        if not self.has_memory_cell:
            from .registry import available_cells, get_cell

            with_memory = [n for n in available_cells() if get_cell(n).memory_cell]
            raise NoMemoryCellError(
                f"cell {self.cell_name!r} has no memory cell, so it has no weighted-sum view "
                f"(eq 8 of Levy et al.). Cells with one: {', '.join(with_memory)}.")
        was_training = self.training
        self.eval()
        try:
            x, lengths, mask = self._prepare(x, lengths)
            result = []
            inp = x
            for layer in self.layers:
                views, outs = [], []
                for d, cell in enumerate(layer):
                    seq = inp if d == 0 else reverse_padded(inp, lengths)
                    views.append(weighted_sum(cell.trace_memory(seq, mask)))
                    out, _ = cell(seq, None, mask)
                    outs.append(out if d == 0 else reverse_padded(out, lengths))
                out = torch.cat(outs, dim=-1)
                if self.residual and out.shape[-1] == inp.shape[-1]:
                    out = out + inp
                    if mask is not None:
                        out = out * mask.unsqueeze(-1)
                inp = out
                result.append(views)
            return result
        finally:
            self.train(was_training)


def _dropout_mask(p: float, training: bool, B: int, size: int, like: Tensor) -> Tensor | None:
    """A (B, size) inverted-dropout mask (keep / (1 - p)), or None when nothing is dropped."""
    if not (training and p > 0):
        return None
    keep = like.new_empty(B, size).bernoulli_(1 - p)
    return keep / (1 - p)
