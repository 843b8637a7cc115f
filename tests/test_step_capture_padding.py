"""The length buckets of ``train.step_capture`` on the variable-length tasks (nmt, parsing,
sst, squad-drqa, squad-bidaf, dyck): their ``batch_length`` / ``pad_batch`` hooks.

* a batch padded beyond its own lengths (in every dimension a task pads) gives the loss, the
  weight, the tokens and every parameter's gradient of the batch itself, in float64 (the
  dtype's tolerance, tests/tolerance.py) -- through the cells' fast paths and through their
  masked reference loops; in training mode, with the dropout that does not depend on a
  batch's length left on (the parser's same-mask and recurrent dropout: the same draws);
* the buckets chosen from the lengths of a real epoch (every batch of the first epoch of
  each task at its paper configuration, as ``tests/fixtures/capture/make_batch_lengths.py``
  recorded them) give at most ``train.capture_slots`` padded shapes, and each batch pads to
  the smallest that holds it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

from lstmablate.cells import build_encoder, reference_mode
from lstmablate.config import update_dataclass
from lstmablate.task import get_task
from lstmablate.train.capture import (StepCapture, bucket_for, choose_buckets, choose_grid,
                                      pad_to, shape_key)
from tolerance import assert_close

FIXTURES = Path(__file__).parent / "fixtures"
F64 = torch.float64

#: (task, data, model, data dir) of a tiny model on each task's fixtures; dropout off where its
#: draws depend on a batch's length (dropout per position: a padded batch draws more)
TASKS = {
    "nmt": ("nmt", dict(verify=False, batch_size=4),
            dict(word_vec_size=8, hidden_size=8, dropout=0.0), FIXTURES / "nmt"),
    "nmt-decoder-cell": ("nmt", dict(verify=False, batch_size=4),
                         dict(word_vec_size=8, hidden_size=8, dropout=0.0,
                              cell_layers="encoder+decoder", encoder_type="brnn"),
                         FIXTURES / "nmt"),
    "dyck": ("dyck", dict(k=2, m=3, train_tokens=0, train_sequences=32, dev_sequences=8,
                          test_sequences=8, train_max_length=12, batch_size=8),
             dict(embedding_dim=8, hidden_size=8, num_layers=2, dropout=0.0), FIXTURES),
    "dyck-close": ("dyck", dict(k=2, m=3, train_tokens=0, train_sequences=32, dev_sequences=8,
                                test_sequences=8, train_max_length=12, batch_size=8,
                                objective="close"),
                   dict(embedding_dim=8, hidden_size=8, num_layers=2, dropout=0.0), FIXTURES),
    "sst": ("sst", dict(verify=False, batch_size=3),
            dict(embedding_size=8, hidden_size=6, mlp_hidden=8, dropout=0.0, encoder_dropout=0.0,
                 num_layers=2, pooling="max"), FIXTURES),
    "sst-last": ("sst", dict(verify=False, batch_size=3),
                 dict(embedding_size=8, hidden_size=6, mlp_hidden=0, dropout=0.0,
                      num_layers=2, pooling="last", layer_mix="scalar"), FIXTURES),
    # same-mask (input, MLP) and recurrent dropout: one draw per sentence, whatever its length
    "parsing": ("parsing", dict(files="parsing", n_buckets=3, batch_tokens=60),
                dict(word_size=8, tag_size=8, hidden_size=8, num_layers=2, arc_mlp=8, rel_mlp=4,
                     word_dropout=0.0, tag_dropout=0.0, input_dropout=0.3, mlp_dropout=0.3,
                     recurrent_dropout=0.3), FIXTURES),
    "squad-drqa": ("squad-drqa", dict(verify=False, tokenizer="regex", batch_size=3),
                   dict(embedding_dim=8, hidden_size=6, doc_layers=2, question_layers=1,
                        dropout_emb=0.0, dropout_rnn=0.0), FIXTURES / "squad"),
    "squad-bidaf": ("squad-bidaf", dict(verify=False, tokenizer="regex", batch_size=3),
                    dict(word_dim=8, char_dim=4, char_filters=6, hidden_size=6, dropout=0.0,
                         char_dropout=0.0), FIXTURES / "squad"),
    "squad-bidaf-word-windows": ("squad-bidaf", dict(verify=False, tokenizer="regex", batch_size=3),
                                 dict(word_dim=8, char_dim=4, char_filters=6, hidden_size=6,
                                      dropout=0.0, char_dropout=0.0, char_windows="word"),
                                 FIXTURES / "squad"),
}


def tiny_task(key: str):
    name, data, model, data_dir = TASKS[key]
    cls = get_task(name)
    task = cls(update_dataclass(cls.DataConfig(), data, "data", "test"),
               update_dataclass(cls.ModelConfig(), model, "model", "test"), data_dir, seed=1)
    task.use_artefacts(json.loads(json.dumps(task.build_artefacts())))
    task.setup(["train"])
    return task


def _double(batch):
    return pytree.tree_map(lambda t: t.double() if torch.is_tensor(t) and t.is_floating_point()
                           else t, batch)


def _loss_and_grads(task, model, batch):
    torch.manual_seed(3)  # the same dropout draws for the padded and the unpadded batch
    out = task.loss(model, batch, None)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    return out, grads


def _longer(length, extra=(3, 2, 5, 2)):
    if isinstance(length, int):
        return length + extra[0]
    return tuple(n + e for n, e in zip(length, extra))


@pytest.mark.parametrize("loops", ["fast", "reference"])
@pytest.mark.parametrize("key", sorted(TASKS))
def test_a_padded_batch_gives_the_loss_and_gradients_of_the_batch(key, loops):
    task = tiny_task(key)
    torch.manual_seed(0)
    model = task.build_model(functools.partial(build_encoder, "lstm")).double().train()
    plan = task.train_plan(0, torch.Generator().manual_seed(1))
    with reference_mode(loops == "reference"):
        for i in range(min(len(plan), 3)):
            batch = _double(plan[i])
            length = task.batch_length(batch)
            target = _longer(length)
            padded = task.pad_batch(batch, target)
            assert task.batch_length(padded) == target
            assert shape_key(padded) != shape_key(batch)
            want, want_grads = _loss_and_grads(task, model, batch)
            got, got_grads = _loss_and_grads(task, model, padded)
            assert torch.isfinite(want.loss) and float(want.loss.detach()) != 0.0
            assert_close(got.loss, want.loss, dtype=F64, msg=f"{key} batch {i} loss")
            assert float(got.weight) == float(want.weight)
            if want.tokens is not None:
                assert float(got.tokens) == float(want.tokens)
            if want.logged is not None:
                assert_close(got.logged, want.logged, dtype=F64, msg=f"{key} logged")
            # a gradient is a sum of terms that may cancel: the scale of its roundings is
            # the largest gradient of the model, not its own size
            scale = max(float(g.abs().max()) for g in want_grads if g.numel())
            assert scale > 0
            for (name, _), a, b in zip([(n, p) for n, p in model.named_parameters()
                                        if p.requires_grad], got_grads, want_grads):
                assert_close(a, b, dtype=F64, scale=scale,
                             msg=f"{key} batch {i} gradient of {name}")


def test_padding_is_not_a_no_op_for_the_model():
    """The test above would pass if padding left a batch unchanged: it does change the
    tensors, and an unmasked read of a padded position would change the loss (the NMT
    source padded with a real word instead of <blank>, its lengths unchanged, is masked
    too -- but a source whose lengths were stretched is not)."""
    task = tiny_task("nmt")
    torch.manual_seed(0)
    model = task.build_model(functools.partial(build_encoder, "lstm")).double().train()
    batch = task.train_plan(0, torch.Generator().manual_seed(1))[0]
    S, T = task.batch_length(batch)
    padded = task.pad_batch(batch, (S + 3, T + 2))
    assert padded["src"][:, S:].eq(task.src_vocab.pad).all()
    assert padded["tgt_out"][:, T:].eq(task.tgt_vocab.pad).all()
    stretched = dict(padded, src_lengths=padded["src_lengths"] + 3)
    a = task.loss(model, padded, None).loss
    b = task.loss(model, stretched, None).loss
    assert abs(float(a) - float(b)) > 1e-6


# ---------------------------------------------------------------------------------------
# buckets on the lengths of real epochs
# ---------------------------------------------------------------------------------------

REAL = json.loads((FIXTURES / "capture" / "batch_lengths.json").read_text())


class LengthsTask:
    """A stand-in whose batches are their lengths (what the capture reads of a batch)."""

    def batch_length(self, batch):
        return batch

    def pad_batch(self, batch, length):
        return length


@pytest.mark.parametrize("slots", [2, 8])
@pytest.mark.parametrize("name", sorted(REAL["tasks"]))
def test_buckets_of_a_real_epoch_are_at_most_the_slots(name, slots):
    rec = REAL["tasks"][name]
    lengths = [x if isinstance(x, int) else tuple(x) for x in rec["batches"]]
    assert len(lengths) >= 20  # a real epoch, not a handful of batches
    cap = StepCapture("compile", LengthsTask(), torch.device("cpu"), slots=slots)
    buckets = cap.prepare(lengths)
    padded = [cap.pad(n) for n in lengths]
    if len(lengths) <= 512:  # (every batch was read: each one fits)
        assert all(p is not None for p in padded)
    shapes = set(padded)
    assert len(shapes) <= slots, (name, buckets)
    assert len(cap.cache.allowed) <= slots
    for n, p in zip(lengths, padded):  # each batch to the smallest bucket that holds it
        if isinstance(n, int):
            assert p == bucket_for(n, buckets) >= n
        else:
            assert p == tuple(bucket_for(a, b) for a, b in zip(n, buckets))
    # more slots never pad more, and one slot pads everything to the longest
    dims = 1 if isinstance(lengths[0], int) else len(lengths[0])
    cols = [[n] if isinstance(n, int) else list(n) for n in lengths]

    def padding(ps):
        return sum(sum(x) for x in ([p] if isinstance(p, int) else list(p) for p in ps))

    real = sum(sum(c) for c in cols)
    one = [tuple(max(c[d] for c in cols) for d in range(dims))] * len(lengths)
    assert padding(padded) - real <= padding(one) - real


def test_the_grid_is_the_exact_buckets_in_one_dimension_and_grows_where_it_saves_most():
    lengths = [(3,), (3,), (4,), (9,), (9,), (10,), (17,)]
    assert choose_grid(lengths, 3) == (choose_buckets([3, 3, 4, 9, 9, 10, 17], 3),)
    # the second dimension is constant: every bucket goes to the first
    two = [(n, 5) for n in (3, 3, 4, 9, 9, 10, 17)]
    assert choose_grid(two, 3) == ((4, 10, 17), (5,))
    # two independent dimensions, four shapes allowed: two buckets each (2 x 2 = 4 shapes)
    grid = [(a, b) for a in (2, 10) for b in (20, 100)]
    assert choose_grid(grid, 4) == ((2, 10), (20, 100))
    assert choose_grid(grid, 3) in (((2, 10), (100,)), ((10,), (20, 100)))
    assert choose_grid([], 3) == ()
    with pytest.raises(ValueError):
        choose_grid([(1, 2)], 0)


def test_pad_to():
    t = torch.tensor([[1, 2], [3, 4]])
    assert pad_to(t, 1, 4, -1).tolist() == [[1, 2, -1, -1], [3, 4, -1, -1]]
    assert pad_to(t, 0, 3, 0).tolist() == [[1, 2], [3, 4], [0, 0]]
    assert pad_to(t, 1, 2, 9) is t
    with pytest.raises(ValueError):
        pad_to(t, 1, 1, 0)
