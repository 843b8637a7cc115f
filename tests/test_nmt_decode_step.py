"""How a decoding step is computed (``eval.step_capture``, tasks/nmt/stepping.py) changes no
translation: the memory padded to a source-length bucket, a step replayed from a recorded
graph (with a stand-in recorder that keeps a CUDA graph's semantics: static inputs, static
outputs overwritten at every replay), ``graphs`` without a GPU, and (``slow``) the step
compiled by inductor -- beam search and greedy search give the translations of the eager step,
token for token, on the fixture corpus.  The NMT training step's input-feeding loop compiles
into one graph (no break per target position) and equals the eager step (``slow``)."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.train.capture import COMPILE_OPTIONS, StepCache
from lstmablate_tasks.nmt import stepping
from lstmablate_tasks.nmt.search import beam_search, greedy_search
from lstmablate_tasks.nmt.stepping import DecodeStep
from lstmablate_tasks.nmt.task import NMTData, NMTEval, NMTModelConfig, NMTTask
from tolerance import assert_close

FIXTURES = Path(__file__).parent / "fixtures" / "nmt"
TINY = dict(word_vec_size=8, hidden_size=12, dropout=0.3, init_scale=0.5)


def _task(**model) -> NMTTask:
    t = NMTTask(NMTData(verify=False), NMTModelConfig(**{**TINY, **model}), FIXTURES,
                eval_cfg=NMTEval())
    t.use_artefacts(json.loads(json.dumps(t.build_artefacts())))
    t.setup(["train", "val", "test"])
    return t


@functools.lru_cache(maxsize=None)
def _trained(cell_layers: str = "encoder"):
    """A tiny model after 40 training epochs on the fixture pairs (confident enough that its
    beams are not decided by ties)."""
    torch.manual_seed(0)
    task = _task(cell_layers=cell_layers)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for epoch in range(40):
        for batch in task.train_plan(epoch, torch.Generator().manual_seed(epoch)):
            opt.zero_grad()
            task.loss(model, batch, None).loss.backward()
            opt.step()
    return task, model.eval()


def _batches(task, split="test", size=3):
    sd = task.splits[split]
    rows = [i for i, s in enumerate(sd.src_ids) if s]
    return [task._collate(sd, rows[i:i + size], with_target=False)
            for i in range(0, len(rows), size)]


def _same(hyps_a, hyps_b):
    assert [[h.tokens for h in hs] for hs in hyps_a] == [[h.tokens for h in hs] for hs in hyps_b]
    for hs_a, hs_b in zip(hyps_a, hyps_b):
        for a, b in zip(hs_a, hs_b):
            assert a.attention.shape == b.attention.shape
            assert_close(a.attention, b.attention, msg="attention")
            assert_close(a.score, b.score, scale=max(abs(b.score), 1.0), msg="score")


def _decode(model, task, step_for, beam=3, n_best=2):
    """Beam and greedy search over the test split's batches, each batch with the step
    ``step_for(batch)`` gives (None: the default eager step)."""
    v = task.tgt_vocab
    out = []
    with torch.no_grad():
        for batch in _batches(task):
            mem = model.encode(batch["src"], batch["src_lengths"])
            step = step_for(batch)
            extra = {} if step is None else {"step": step}
            out.append(beam_search(model, mem, beam, v.bos, v.eos, 12, n_best=n_best,
                                   stop_early=False, **extra))
            out.append([[h] for h in greedy_search(model, mem, v.bos, v.eos, 12, **extra)])
    return out


@pytest.mark.parametrize("cell_layers", ["encoder", "encoder+decoder"])
def test_the_memory_padded_to_a_bucket_changes_no_translation(cell_layers):
    task, model = _trained(cell_layers)
    want = _decode(model, task, lambda b: None)
    got = _decode(model, task, lambda b: DecodeStep(model, "off", (b["src"].shape[1] + 4, 60)))
    for a, b in zip(got, want):
        _same(a, b)


def test_padding_the_memory_is_masked_not_ignored():
    """The padded memory reaches the attention: a bucket's padding left unmasked (mask true)
    changes the attention (the check above would notice a broken mask)."""
    task, model = _trained()
    batch = _batches(task)[0]
    mem = model.encode(batch["src"], batch["src_lengths"])
    step = DecodeStep(model, "off", (batch["src"].shape[1] + 4,))
    padded = step.memory(mem)
    assert padded.memory.shape[1] == mem.memory.shape[1] + 4 and not padded.mask[:, -4:].any()
    assert step.memory(mem) is padded  # once per batch
    state = model.init_decoder(mem)
    y = torch.full((mem.memory.shape[0],), task.tgt_vocab.bos)
    with torch.no_grad():
        lp, align, _ = step(y, state, mem)
        padded.mask[:, -4:] = True
        out, _, _ = model.decode_step(y, state, padded)
    assert align.shape == (mem.memory.shape[0], mem.memory.shape[1])
    assert not torch.allclose(model.log_probs(out), lp)


class FakeGraph:
    """What a CUDA graph does at replay, on the CPU: the recorded step on the static inputs,
    written into the static outputs."""

    def __init__(self, fn, static, outputs):
        self.fn, self.static, self.outputs = fn, static, outputs
        self.replays = 0

    def replay(self):
        self.replays += 1
        for o, r in zip(self.outputs, self.fn(*self.static)):
            o.copy_(r)


def _fake_record(cls, fn, args):
    static = [a.clone() for a in args]
    outputs = tuple(o.clone() for o in fn(*static))
    return cls(FakeGraph(fn, static, outputs), static, outputs)


def test_replayed_steps_give_the_eager_translations(monkeypatch):
    """Steps replayed from recorded graphs (one per shape; batches of one shape share it, so a
    new batch's memory must be copied in, and outputs kept by the search must be copies)."""
    monkeypatch.setattr(stepping.GraphStep, "record", classmethod(_fake_record))
    task, model = _trained()
    want = _decode(model, task, lambda b: None)
    step = DecodeStep(model, "off", (9, 60))
    step.mode, step.cache = "graphs", StepCache("graphs", max_slots=16, capture_after=1)
    got = _decode(model, task, lambda b: step)
    for a, b in zip(got, want):
        _same(a, b)
    r = step.record()
    assert r["captures"] >= 2 and r["replays"] > r["captures"] and not r["fallback"]
    # fewer recorded shapes than searches: some graph served several batches
    assert r["captures"] < 2 * len(_batches(task))


def test_graphs_without_a_gpu_warn_once_and_decode_eagerly():
    task, model = _trained()
    with pytest.warns(RuntimeWarning, match="CUDA graphs need a CUDA device") as w:
        step = DecodeStep(model, "graphs", (9, 60))
    assert len(w) == 1 and step.mode == "off" and step.buckets == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _decode(model, task, lambda b: step)
    for a, b in zip(got, _decode(model, task, lambda b: None)):
        _same(a, b)


def test_a_failed_compilation_warns_once_and_decodes_eagerly(monkeypatch):
    def broken(*args, **kwargs):
        def fn(*a, **k):
            raise RuntimeError("no C++ compiler")
        return fn

    monkeypatch.setattr(torch, "compile", broken)
    task, model = _trained()
    step = DecodeStep(model, "compile", (9, 60))
    with pytest.warns(RuntimeWarning, match="compilation failed.*no C.. compiler") as w:
        got = _decode(model, task, lambda b: step)
    assert len(w) == 1 and step.record()["fallback"]
    for a, b in zip(got, _decode(model, task, lambda b: None)):
        _same(a, b)


def test_the_eval_option():
    from lstmablate.errors import ConfigError

    NMTEval(step_capture="compile").validate()
    with pytest.raises(ConfigError, match="step_capture"):
        NMTEval(step_capture="cudagraphs").validate()
    assert NMTTask.added_keys["eval.step_capture"] == "off"  # older runs decoded eagerly


# ---------------------------------------------------------------------------------------
# compiled (slow: inductor compiles C++ on the CPU)
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("cell_layers", ["encoder", "encoder+decoder"])
def test_compiled_decoding_translates_as_the_eager_step(cell_layers):
    """task.translate with eval.step_capture=compile: the same tokens for every line of the
    test and val splits, beam search and greedy."""
    task, model = _trained(cell_layers)
    for beam in (3, 1):
        task.eval_cfg = NMTEval(beam_size=beam, max_length=12)
        want = {s: task.translate(model, s) for s in ("test", "val")}
        task.eval_cfg = NMTEval(beam_size=beam, max_length=12, step_capture="compile")
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no fallback: it did compile
            got = {s: task.translate(model, s) for s in ("test", "val")}
        assert got == want
    task.eval_cfg = NMTEval()


@pytest.mark.slow
@pytest.mark.parametrize("cell_layers", ["encoder", "encoder+decoder"])
def test_the_training_steps_decoder_loop_compiles_whole_and_equals_eager(cell_layers):
    """The teacher-forced input-feeding loop (attention + decoder step per target position)
    traces into one graph (fullgraph: a break anywhere fails), the encoder one operator in
    it; its loss and gradients equal the eager step's in float64, dropout included, on a
    batch padded to a bucket."""
    torch.manual_seed(0)
    task = _task(cell_layers=cell_layers)
    model = task.build_model(functools.partial(build_encoder, "lstm")).double().train()
    batch = task.train_plan(0, torch.Generator().manual_seed(1))[0]
    S, T = task.batch_length(batch)
    batch = task.pad_batch(batch, (S + 2, T + 3))
    params = [p for p in model.parameters() if p.requires_grad]

    def loss(b):
        return task.loss(model, b, None).loss

    compiled = torch.compile(loss, fullgraph=True, dynamic=False, options=COMPILE_OPTIONS)
    results = []
    for fn in (loss, compiled):
        torch.manual_seed(5)
        value = fn(batch)
        results.append((value.detach(), torch.autograd.grad(value, params)))
    (want, want_g), (got, got_g) = results
    assert_close(got, want, dtype=torch.float64, msg="loss")
    scale = max(float(g.abs().max()) for g in want_g)
    for a, b in zip(got_g, want_g):
        assert_close(a, b, dtype=torch.float64, scale=scale, msg="gradient")
