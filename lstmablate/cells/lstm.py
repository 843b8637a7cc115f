"""The LSTM family: ONE implementation, every ablation a named flag set.

Equations from Levy, Lee, FitzGerald & Zettlemoyer (ACL 2018):

    c~_t = tanh(W_ch h_{t-1} + W_cx x_t + b_c)     (2)  content layer (an S-RNN)
    i_t  = sigma(W_ih h_{t-1} + W_ix x_t + b_i)     (3)  input gate
    f_t  = sigma(W_fh h_{t-1} + W_fx x_t + b_f)     (4)  forget gate
    c_t  = i_t * c~_t + f_t * c_{t-1}               (5)  memory cell
    o_t  = sigma(W_oh h_{t-1} + W_ox x_t + b_o)     (6)  output gate
    h_t  = o_t * tanh(c_t)                          (7)  output layer
    h_t  = tanh(W_hh h_{t-1} + W_hx x_t + b_h)      (1)  the S-RNN (LSTM - GATES)

Switches (each registered name below is a fixed set of them):

* ``content``: ``"srnn"`` (eq 2) or ``"linear"`` (c~_t = W_cx x_t, no bias and
  no tanh, as printed in §3.1: "LSTM - S-RNN");
* ``output_gate``: eq 7, or h_t = tanh(c_t) without it ("- OUT");
* ``gates_see_hidden``: gates as eqs 3, 4, 6, or sigma(W_gx x_t + b_g) ("- HIDDEN");
* ``memory_cell``: False drops gates and memory cell, leaving eq 1 ("- GATES");
* ``forget_gate``: False gives the 1997 LSTM, c_t = i_t * u_t + c_{t-1}
  (eqs 47-51 of Neubig's notes on RNN language models);
* ``proj_size``: h_t = W_hr (o_t * tanh(c_t)), the LSTM-2048-512 of the draft's
  Billion Word row (Sak et al. 2014, Józefowicz et al. 2016);
* ``forget_bias``: initial value of b_f; None (default) leaves b_f uniform like
  every other parameter, as ``torch.nn.LSTM`` and Zaremba et al.'s TF code do
  (their ``forget_bias=0.0`` is added at run time, not an initial value);
  only cells with a forget gate accept it;
* ``content_bias``: whether c~_t has b_c (default: eq 2 has one, the linear
  content of §3.1 has none).

Parameter layout: the input-side weights of all blocks are one matrix
``weight_ih`` ((n_blocks*H) x I), blocks ordered gates first (i, f, o), content
last (g); ``weight_hh`` holds only the blocks that read h_{t-1}, in the same
order, so the per-step product is exactly the recurrent work the cell does.

**In cuDNN's layout** (``lstm`` and ``lstm-gates``, the cells that are exactly
``torch.nn.LSTM`` / ``torch.nn.RNN``): the blocks are in PyTorch's order (i, f, g, o),
and ``weight_ih``, ``weight_hh``, ``bias`` (and ``weight_hr``) are views of ONE flat
buffer laid out as ``torch.nn.LSTM``'s (on CUDA by cuDNN itself,
``torch._cudnn_rnn_flatten_weight``; elsewhere the same tensors end to end), beside a
constant zero second bias (``bias_hh``, not a parameter: the cell has one bias vector).
So PyTorch's fused kernel reads the parameters in place at every call, with no re-layout
and no gather, and an optimiser's in-place step updates the flat buffer.  The parameter
names, the checkpoint keys, the reference loop and the weighted-sum view are unchanged
(they name blocks through ``blocks``); a checkpoint written before (module version 1:
blocks i, f, o, g) is reordered as it loads (:meth:`LSTMFamilyCell.legacy_rows`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError

from .base import Cell, FastKernels, State
from .registry import register_cell

_LSTM_EQ = "Levy et al. 2018 eqs 2-7"


@register_cell("lstm", family="lstm", equations=_LSTM_EQ,
               summary="c~=tanh(W[h;x]+b); i,f,o=σ(W[h;x]+b); c=i∘c~+f∘c'; h=o∘tanh(c)")
@register_cell("lstm-srnn", family="lstm", equations="Levy et al. 2018 §3.1",
               summary="c~=W_cx x (linear content); gates see h; h=o∘tanh(c)",
               content="linear")
@register_cell("lstm-srnn-out", family="lstm", equations="Levy et al. 2018 §3.1, eq 9",
               summary="c~=W_cx x; gates see h; h=tanh(c) (no output gate)",
               content="linear", output_gate=False)
@register_cell("lstm-srnn-hidden", family="lstm", equations="Levy et al. 2018 §3.1",
               summary="c~=W_cx x; i,f,o=σ(W x+b) (no h anywhere); h=o∘tanh(c)",
               content="linear", gates_see_hidden=False)
@register_cell("lstm-srnn-hidden-out", family="lstm", equations="Levy et al. 2018 §3.1",
               summary="c~=W_cx x; i,f=σ(W x+b); h=tanh(c) (no output gate, no h in gates)",
               content="linear", gates_see_hidden=False, output_gate=False)
@register_cell("lstm-gates", family="lstm", equations="Levy et al. 2018 eq 1",
               summary="h=tanh(W_hh h'+W_hx x+b) (the S-RNN)", aliases=("srnn",),
               memory_cell=False)
@register_cell("lstm-noforget", family="lstm", equations="Neubig notes eqs 47-51",
               summary="u=tanh(W[h;x]+b); i,o=σ(W[h;x]+b); c=i∘u+c'; h=o∘tanh(c)",
               forget_gate=False)
class LSTMFamilyCell(Cell):
    """One LSTM-family layer; see the module docstring for the switches."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        content: str = "srnn",
        output_gate: bool = True,
        gates_see_hidden: bool = True,
        memory_cell: bool = True,
        forget_gate: bool = True,
        proj_size: int = 0,
        forget_bias: float | None = None,
        content_bias: bool | None = None,
        init_scale: float | None = None,
    ):
        super().__init__(input_size, hidden_size)
        if content not in ("srnn", "linear"):
            raise ConfigError(f"content must be 'srnn' or 'linear', got {content!r}")
        if not memory_cell and content != "srnn":
            raise ConfigError("without a memory cell the content layer must be the S-RNN (eq 1)")
        if proj_size < 0 or proj_size >= hidden_size and proj_size:
            raise ConfigError(f"proj_size must be in [0, hidden_size), got {proj_size}")
        if proj_size and not memory_cell:
            raise ConfigError("proj_size projects o_t * tanh(c_t); a cell without a memory cell "
                              "(lstm-gates) has nothing to project")
        if not memory_cell and not (output_gate and gates_see_hidden and forget_gate):
            raise ConfigError("output_gate, gates_see_hidden and forget_gate switch parts of the "
                              "gates, which a cell without a memory cell (lstm-gates) does not have")
        if forget_bias is not None and not (forget_gate and memory_cell):
            raise ConfigError("forget_bias initialises b_f, but this cell has no forget gate")
        self.content, self.memory_cell = content, memory_cell
        self.use_output_gate = output_gate and memory_cell
        self.gates_see_hidden = gates_see_hidden
        self.use_forget_gate = forget_gate and memory_cell
        self.proj_size = proj_size
        self.forget_bias = forget_bias
        if content_bias is None:
            content_bias = content == "srnn"
        self.content_bias = content_bias

        # blocks in order: gates (i, f, o as present) then content g
        gates = []
        if memory_cell:
            gates.append("i")
            if self.use_forget_gate:
                gates.append("f")
            if self.use_output_gate:
                gates.append("o")
        #: the order of the blocks before cuDNN's layout (what a version-1 checkpoint holds)
        self.legacy_blocks = tuple(gates) + ("g",)
        #: exactly torch.nn.LSTM (eqs 2-7, optionally projected) or torch.nn.RNN (eq 1): the
        #: parameters live in cuDNN's layout (the module docstring)
        self.cudnn_layout = (not memory_cell) or (
            content == "srnn" and self.use_forget_gate and self.use_output_gate
            and gates_see_hidden and content_bias)
        self.blocks = (("i", "f", "g", "o") if memory_cell and self.cudnn_layout
                       else self.legacy_blocks)
        reads_h = set(gates if gates_see_hidden else ()) | ({"g"} if content == "srnn" else set())
        recurrent = [b for b in self.blocks if b in reads_h]
        self.recurrent_blocks = tuple(recurrent)
        H = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(len(self.blocks) * H, input_size))
        self.weight_hh = (nn.Parameter(torch.empty(len(recurrent) * H, self.output_size))
                          if recurrent else None)
        n_bias = len(gates) + (1 if content_bias else 0)
        self.bias = nn.Parameter(torch.empty(n_bias * H)) if n_bias else None
        self.weight_hr = nn.Parameter(torch.empty(proj_size, H)) if proj_size else None
        # the second bias of PyTorch's kernels: a constant zero (part of the flat buffer)
        self.register_buffer("bias_hh", torch.zeros(n_bias * H) if self.cudnn_layout
                             and self.bias is not None else None, persistent=False)
        # where each recurrent block sits among all blocks, for the per-step add
        self._rec_index = [self.blocks.index(b) for b in recurrent]
        self.reset_parameters(init_scale)
        self.flatten_parameters()

    # -- description ----------------------------------------------------------
    @property
    def output_size(self) -> int:
        return self.proj_size or self.hidden_size

    @property
    def state_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("h", "c") if self.memory_cell else ("h",)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.output_size, self.hidden_size) if self.memory_cell else (self.hidden_size,)

    @property
    def has_memory_cell(self) -> bool:
        return self.memory_cell

    def reset_parameters(self, init_scale: float | None = None) -> None:
        """uniform(±init_scale), default ±1/sqrt(H) as torch.nn.LSTM; then b_f = forget_bias if set."""
        a = init_scale if init_scale is not None else 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -a, a)
        if self.use_forget_gate and self.bias is not None and self.forget_bias is not None:
            f = self.blocks.index("f") * self.hidden_size
            with torch.no_grad():
                self.bias[f:f + self.hidden_size].fill_(self.forget_bias)

    # -- cuDNN's layout ---------------------------------------------------------------
    #: 2: the blocks of the cells in cuDNN's layout in PyTorch's order (i, f, g, o)
    _version = 2

    @property
    def torch_weights(self) -> list[Tensor] | None:
        """The weights as ``torch._VF.lstm`` / ``rnn_tanh`` read them (w_ih, w_hh, b_ih, b_hh,
        w_hr as present): views of the flat buffer, no copy; None for a cell that is not in
        cuDNN's layout (``common/delegate.py`` then hands its weights over re-laid out)."""
        if not self.cudnn_layout:
            return None
        ws = [self.weight_ih, self.weight_hh]
        if self.bias is not None:
            ws += [self.bias, self.bias_hh]
        if self.weight_hr is not None:
            ws.append(self.weight_hr)
        return ws

    def flatten_parameters(self) -> None:
        """Make the weights views of one flat buffer, as ``torch.nn.LSTM.flatten_parameters``
        does: on CUDA in cuDNN's own layout, elsewhere the tensors end to end (in place: the
        parameters stay the same objects, an optimiser holding them keeps working)."""
        ws = self.torch_weights
        if ws is None:
            return
        first = ws[0]
        with torch.no_grad():
            if (first.is_cuda and torch.backends.cudnn.is_acceptable(first)
                    and all(w.dtype == first.dtype and w.device == first.device for w in ws)
                    and torch._use_cudnn_rnn_flatten_weight()):
                from torch.backends.cudnn import rnn

                mode = rnn.get_cudnn_mode("LSTM" if self.memory_cell else "RNN_TANH")
                with torch.cuda.device_of(first):
                    torch._cudnn_rnn_flatten_weight(ws, len(ws), self.input_size, mode,
                                                    self.hidden_size, self.proj_size, 1, False,
                                                    False)
                return
            flat = torch.empty(sum(w.numel() for w in ws), dtype=first.dtype,
                               device=first.device)
            offset = 0
            for w in ws:
                n = w.numel()
                flat[offset:offset + n].copy_(w.reshape(-1))
                w.set_(flat.untyped_storage(), offset, w.shape, w.new_empty(w.shape).stride())
                offset += n

    def flat_buffer(self) -> Tensor | None:
        """The whole flat buffer the weights are views of, as one 1-D tensor (None outside
        cuDNN's layout); for tests and diagnostics."""
        ws = self.torch_weights
        if ws is None:
            return None
        w = ws[0]
        n = w.untyped_storage().nbytes() // w.element_size()
        return w.new_empty(0).set_(w.untyped_storage(), 0, (n,), (1,))

    def _apply(self, fn, recurse=True):  # .to(), .double(), .cuda(): one buffer again
        out = super()._apply(fn, recurse)
        self.flatten_parameters()
        return out

    def legacy_rows(self, version: int | None) -> dict[str, Tensor]:
        """For a state dict of module ``version`` (None: made in this process, current): the
        parameters whose rows it holds in another order, each with the index that reorders
        them (``rows[index]``) into this cell's; ``load_state_dict`` applies it, and a
        resumed optimiser's per-parameter state gets the same
        (``train/checkpoint.migrate_optimizer_rows``)."""
        if version is None or version >= 2 or self.blocks == self.legacy_blocks:
            return {}
        H = self.hidden_size

        def index(old: tuple[str, ...], new: tuple[str, ...]) -> Tensor:
            return torch.cat([torch.arange(H) + old.index(b) * H for b in new])

        rec_old = tuple(b for b in self.legacy_blocks if b in self.recurrent_blocks)
        out = {"weight_ih": index(self.legacy_blocks, self.blocks),
               "weight_hh": index(rec_old, self.recurrent_blocks)}
        if self.bias is not None:
            out["bias"] = index(self.legacy_blocks, self.blocks)
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        rows = self.legacy_rows(local_metadata.get("version"))
        if rows:  # a checkpoint of the order before cuDNN's layout: its rows reordered
            state_dict = dict(state_dict)  # (the caller's dict and tensors are left as they are)
            for name, index in rows.items():
                t = state_dict.get(prefix + name)
                if isinstance(t, Tensor) and t.shape[:1] == (index.numel(),):
                    state_dict[prefix + name] = t.index_select(0, index.to(t.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, blocks={''.join(self.blocks)}, "
                f"recurrent={''.join(self.recurrent_blocks) or '-'}, proj_size={self.proj_size}")

    # -- computation --------------------------------------------------------------
    fast_kernels = FastKernels("lstmablate.cells.kernels.lstm.family",
                               math=("step", "project_inputs", "_preactivations", "_gates"))

    def project_inputs(self, x: Tensor) -> Tensor:
        """W_*x x_t (+ b_*) for every block and every step: one matrix product."""
        xp = x @ self.weight_ih.t()
        if self.bias is not None:
            n = self.bias.shape[0]
            xp = torch.cat([xp[..., :n] + self.bias, xp[..., n:]], dim=-1) if n < xp.shape[-1] \
                else xp + self.bias
        return xp

    def _preactivations(self, xp: Tensor, h_prev: Tensor, h_mask: Tensor | None) -> list[Tensor]:
        H = self.hidden_size
        pre = list(xp.split(H, dim=-1))
        if self.weight_hh is not None:
            hh = h_prev if h_mask is None else h_prev * h_mask
            rec = (hh @ self.weight_hh.t()).split(H, dim=-1)  # W_*h h_{t-1}
            for k, r in zip(self._rec_index, rec):
                pre[k] = pre[k] + r
        return pre

    def _gates(self, pre: list[Tensor]) -> dict[str, Tensor]:
        z = dict(zip(self.blocks, pre))
        out = {b: torch.sigmoid(z[b]) for b in ("i", "f", "o") if b in z}  # eqs 3, 4, 6
        out["g"] = torch.tanh(z["g"]) if self.content == "srnn" else z["g"]  # eq 2 / §3.1
        return out

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        h_prev = state[0]
        pre = self._preactivations(xp, h_prev, h_mask)
        if not self.memory_cell:
            h = torch.tanh(pre[-1])  # eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h)
            return h, (h,)
        c_prev = state[1]
        g = self._gates(pre)
        if self.use_forget_gate:
            c = g["i"] * g["g"] + g["f"] * c_prev  # eq 5
        else:
            c = g["i"] * g["g"] + c_prev  # Neubig eq 50: no forget gate
        h = g["o"] * torch.tanh(c) if self.use_output_gate else torch.tanh(c)  # eq 7 / - OUT
        if self.weight_hr is not None:
            h = h @ self.weight_hr.t()  # projection to proj_size
        return h, (h, c)

    def trace_memory(self, x: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
        """i_t, f_t (1 without a forget gate), c~_t and c_t for eq 8."""
        if not self.memory_cell:
            return super().trace_memory(x, mask)
        T, B = x.shape[0], x.shape[1]
        xp = self.project_inputs(x)
        h, c = self.initial_state(B, x)
        writes, keeps, contents, memories = [], [], [], []
        for t in range(T):
            g = self._gates(self._preactivations(xp[t], h, None))
            write = g["i"]
            keep = g["f"] if self.use_forget_gate else torch.ones_like(write)
            if mask is not None:  # padding: nothing written, everything kept
                m = mask[t].unsqueeze(-1).to(x.dtype)
                write, keep = write * m, keep * m + (1 - m)
            c = write * g["g"] + keep * c
            h_new = g["o"] * torch.tanh(c) if self.use_output_gate else torch.tanh(c)
            if self.weight_hr is not None:
                h_new = h_new @ self.weight_hr.t()
            h = h_new if mask is None else mask[t].unsqueeze(-1) * h_new + (1 - mask[t].unsqueeze(-1)) * h
            writes.append(write)
            keeps.append(keep)
            contents.append(g["g"])
            memories.append(c)
        stack = (lambda xs: torch.stack(xs)) if T else (lambda xs: x.new_zeros(0, B, self.hidden_size))
        return {"write": stack(writes), "keep": stack(keeps),
                "content": stack(contents), "memory": stack(memories)}
