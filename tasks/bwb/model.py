"""LSTM-2048-512 of Józefowicz et al. (2016), as their public code builds it.

    word id -> embedding (emb_size 512) -> dropout
        -> recurrent layer(s) from the registry: 2048 units, output projected to 512
           (``proj_size``; the projection is also what the recurrence reads)
        -> dropout -> softmax layer over the whole vocabulary (its own weights, no tying):
           sampled softmax in training, full softmax in evaluation

Every value below is read from rafaljozefowicz/lm (``language_model.py``, ``model_utils.py``; the
same code is reused by Levy et al.'s group in kentonl/ran ``bwb/``):

* dropout ``1 - keep_prob`` = 0.1 on the embedding output and after every layer
  (README: "10% dropout before and after each LSTM layer"); none on the recurrent state;
* initialisation: embedding and softmax matrices uniform(±sqrt(3 / shard_rows)) — TF's
  ``uniform_unit_scaling_initializer`` on each of ``num_shards`` = 8 row shards of a V x 512
  matrix (shard_rows = ceil(V / 8)); the softmax bias TF's default glorot_uniform for a vector of
  V, uniform(±sqrt(3 / V)); the LSTM kernel [x; h] -> 4 x 2048 glorot_uniform, i.e.
  uniform(±sqrt(6 / (I + P + 4H))) for the input and recurrent weights together, the projection
  2048 -> 512 glorot_uniform, biases 0, and ``forget_bias`` 1.0 (added at run time by their
  LSTMCell; here b_f starts at 1.0, which trains identically: the gradient w.r.t. b_f is the
  same either way);
* the embedding's gradient is multiplied by the per-GPU batch size before the update
  (``_backward``: ``emb_grads[i].values * hps.batch_size``), :attr:`BWBLanguageModel.emb_grad_scale`.

``sparse_grads``: the embedding and softmax matrices get sparse gradients holding only the rows
a batch uses (TF's IndexedSlices); SGD and Adagrad update them sparsely, which saves the dense
793,470 x 512 gradients (measured on CPU: experiments/bwb_step_time.py).  DistributedDataParallel
all-reduces sparse gradients only with gloo, so on GPUs (NCCL) keep them dense, the default.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .sampled_softmax import Candidates, LogUniformSampler, full_log_probs, sampled_softmax_nll

State = tuple[Tensor, ...]


class BWBLanguageModel(nn.Module):
    """Embedding -> encoder -> (sampled | full) softmax, with a carried state."""

    def __init__(self, vocab_size: int, emb_size: int, encoder: nn.Module, dropout: float,
                 num_sampled: int, emb_grad_scale: float = 1.0, softmax_shards: int = 8,
                 unique_samples: bool = True, sparse_grads: bool = False):
        super().__init__()
        self.vocab_size, self.emb_size = vocab_size, emb_size
        self.sparse_grads = sparse_grads
        self.embedding = nn.Embedding(vocab_size, emb_size, sparse=sparse_grads)
        self.encoder = encoder
        self.dropout = float(dropout)
        out = encoder.output_size
        self.softmax_w = nn.Parameter(torch.empty(vocab_size, out))
        self.softmax_b = nn.Parameter(torch.empty(vocab_size))
        self.num_sampled = num_sampled
        self.sampler = (LogUniformSampler(vocab_size, num_sampled, unique=unique_samples)
                        if num_sampled else None)
        self.softmax_shards = softmax_shards
        self.emb_grad_scale = float(emb_grad_scale)
        if self.emb_grad_scale != 1.0:
            self.embedding.weight.register_hook(lambda g: g * self.emb_grad_scale)

    def init_weights(self) -> None:
        """Józefowicz et al.'s initialisation (see the module docstring)."""
        V = self.vocab_size
        shard_rows = math.ceil(V / self.softmax_shards)
        with torch.no_grad():
            a = math.sqrt(3.0 / shard_rows)
            nn.init.uniform_(self.embedding.weight, -a, a)
            nn.init.uniform_(self.softmax_w, -a, a)
            b = math.sqrt(3.0 / V)
            nn.init.uniform_(self.softmax_b, -b, b)
            init_encoder_glorot(self.encoder)

    def hidden(self, inputs: Tensor, state: State | None) -> tuple[Tensor, State]:
        """``inputs`` (B, T) ids -> top-layer outputs (B, T, P) and the final state."""
        emb = nn.functional.dropout(self.embedding(inputs), self.dropout, self.training)
        out, final = self.encoder(emb, None, state)
        return nn.functional.dropout(out, self.dropout, self.training), final

    def sampled_nll(self, h: Tensor, targets: Tensor,
                    generator: torch.Generator | None = None) -> Tensor:
        """Per-position sampled-softmax loss; one candidate set for the whole batch."""
        assert self.sampler is not None
        cand: Candidates = self.sampler.sample(generator)
        target_log_q = self.sampler.expected_log_count(targets, cand.num_tries)
        return sampled_softmax_nll(h, targets, self.softmax_w, self.softmax_b, cand,
                                   target_log_q=target_log_q, sparse=self.sparse_grads)

    def full_nll(self, h: Tensor, targets: Tensor, chunk: int = 256) -> Tensor:
        return -full_log_probs(h, targets, self.softmax_w, self.softmax_b, chunk)

    def forward(self, inputs: Tensor, targets: Tensor, state: State | None = None,
                chunk: int = 256) -> tuple[Tensor, State]:
        """Per-position NLL (B, T) and the final state: sampled softmax while training (when
        ``num_sampled`` > 0), the full softmax otherwise."""
        h, final = self.hidden(inputs, state)
        flat_h, flat_t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        if self.training and self.sampler is not None:
            nll = self.sampled_nll(flat_h, flat_t)
        else:
            nll = self.full_nll(flat_h, flat_t, chunk)
        return nll.view_as(targets), final


def init_encoder_glorot(encoder: nn.Module) -> None:
    """TF's glorot_uniform on the LSTM kernel, 0 biases, b_f = the cell's ``forget_bias``.

    ``reset_parameters(0.0)`` zeroes every parameter and applies the cell's own documented
    special initialisation (the ``forget_bias`` option); then each weight matrix gets
    uniform(±sqrt(6 / (fan_in + fan_out))), where the input and recurrent weights of a cell
    count as the one TF kernel [x; h] -> all blocks they are in TF.
    """
    reset = getattr(encoder, "reset_parameters", None)
    if reset is not None:
        reset(0.0)
    for module in encoder.modules():
        params = dict(module.named_parameters(recurse=False))
        w_ih, w_hh = params.get("weight_ih"), params.get("weight_hh")
        for name, p in params.items():
            if p.dim() < 2:
                continue
            if name in ("weight_ih", "weight_hh") and w_ih is not None:
                rec_in = w_hh.shape[1] if w_hh is not None else 0
                limit = math.sqrt(6.0 / (w_ih.shape[1] + rec_in + w_ih.shape[0]))
            else:
                limit = math.sqrt(6.0 / (p.shape[0] + p.shape[1]))
            with torch.no_grad():
                nn.init.uniform_(p, -limit, limit)


def detach_state(state: Any) -> Any:
    if state is None:
        return None
    return tuple(s.detach() for s in state)


def state_to(state: Any, device: torch.device) -> Any:
    if state is None:
        return None
    return tuple(s.to(device) for s in state)
