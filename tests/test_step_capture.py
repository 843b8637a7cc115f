"""``train.step_capture`` (``lstmablate/train/capture.py``), on the CPU.

* the capture logic with the cache's own code: the length buckets chosen from the data
  (against a brute-force search), the slots (sightings, the bound, eviction, a change of the
  optimiser's settings recording again, too many changes giving up), the fallback (one
  warning line, eager and the same numbers afterwards), a padded batch; the ``graphs`` flow
  (capture, replay, re-capture, a failed recording) with a stand-in recorder, since CUDA
  graphs exist only on a GPU (the real capture: ``tests/gpu/test_gpu_step_capture.py``);
* the encoder as one operator (``lstmablate::encoder``: ``torch.library.opcheck``);
* ``compile`` through inductor's CPU backend (``slow``): every task's training step equals
  the eager step within float64 rounding over several steps with dropout, and a compiled run
  interrupted and resumed ends exactly where an uninterrupted compiled run ends.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import warnings
from pathlib import Path

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.common import custom_ops
from lstmablate.config import TrainConfig, update_dataclass
from lstmablate.errors import ConfigError
from lstmablate.task import StepOutput, get_task
from lstmablate.train import capture
from lstmablate.train.capture import StepCache, StepCapture, bucket_for, choose_buckets

FIXTURES = Path(__file__).parent / "fixtures"
F64 = torch.float64


# ---------------------------------------------------------------------------------------
# buckets
# ---------------------------------------------------------------------------------------

def _padding(lengths, buckets):
    return sum(bucket_for(n, buckets) - n for n in lengths)


def test_buckets_by_hand():
    # {3, 10}: 2 + 1 + 0 + 0 = 3 padded positions; {2, 10}: 8; {1, 10}: 15
    assert choose_buckets([1, 2, 3, 10], 2) == (3, 10)
    assert choose_buckets([5, 1, 5, 2], 8) == (1, 2, 5)  # room for every length
    assert choose_buckets([4, 4, 4], 1) == (4,)
    assert choose_buckets([], 3) == ()
    assert bucket_for(3, (3, 10)) == 3 and bucket_for(4, (3, 10)) == 10
    assert bucket_for(11, (3, 10)) is None
    with pytest.raises(ValueError):
        choose_buckets([1], 0)


def test_buckets_are_the_least_padding_of_all_choices():
    rng = random.Random(0)
    for _ in range(40):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 25))]
        k = rng.randint(1, 4)
        got = choose_buckets(lengths, k)
        distinct = sorted(set(lengths))
        assert len(got) <= k and got[-1] == max(lengths)
        best = min(_padding(lengths, (*c, distinct[-1]))
                   for r in range(0, min(k, len(distinct)))
                   for c in itertools.combinations(distinct[:-1], r))
        assert _padding(lengths, got) == best


def test_buckets_weigh_the_batches():
    # length 9 is rare, 5 is common: with weights the common one gets its own bucket
    assert choose_buckets([5, 9], 1) == (9,)
    assert choose_buckets([2, 5, 9], 2, weights=[1, 100, 1]) == (5, 9)


# ---------------------------------------------------------------------------------------
# the cache
# ---------------------------------------------------------------------------------------

def test_a_shape_is_captured_on_its_second_sighting_within_the_bound():
    c = StepCache("compile", max_slots=2, capture_after=2)
    assert c.plan("a") == "eager"
    assert c.plan("a") == "capture"
    c.store("a", "slot-a")
    assert c.plan("a") == "replay"
    assert [c.plan("b"), c.plan("b")] == ["eager", "capture"]
    c.store("b", "slot-b")
    assert [c.plan("c") for _ in range(5)] == ["eager"] * 5  # no room, and compile never evicts
    assert c.record()["captures"] == 2 and c.record()["shapes"] == 3


def test_shapes_chosen_from_the_data_are_taken_at_their_first_sighting_and_no_other():
    c = StepCache("compile", max_slots=2, capture_after=5)
    c.allow(["common", "frequent"])
    assert c.plan(("common", None), shape="common") == "capture"
    c.store(("common", None), 1)
    assert c.plan(("common", None), shape="common") == "replay"
    assert c.plan(("common", "carry"), shape="common") == "capture"  # (another carry: a key)
    assert [c.plan(("rare", None), shape="rare") for _ in range(9)] == ["eager"] * 9


def test_graphs_evict_only_for_a_shape_seen_twice_as_often():
    c = StepCache("graphs", max_slots=1, capture_after=2, evicts=True)
    for _ in range(2):
        how = c.plan("rare")
    assert how == "capture"
    c.store("rare", 1)
    assert c.plan("common") == "eager"  # seen once: 2 x 2 > 1
    assert c.plan("common") == "eager"  # seen twice: 2 x 2 > 2
    assert c.plan("common") == "eager"  # three times: 4 > 3
    assert c.plan("common") == "capture"  # four times: the rare one's slot is freed
    assert "rare" not in c.slots and c.evictions == 1


def test_new_optimiser_settings_record_again_and_too_many_give_up():
    c = StepCache("graphs", max_slots=4, capture_after=1, max_invalidations=2)
    assert c.plan("a", stamp=(0.1,)) == "capture"
    c.store("a", 1)
    assert c.plan("a", stamp=(0.1,)) == "replay"
    assert c.plan("a", stamp=(0.05,)) == "capture"  # the rate changed: its graph is dropped
    c.store("a", 2)
    assert c.invalidations == 1
    assert c.plan("a", stamp=(0.025,)) == "capture"
    c.store("a", 3)
    with pytest.warns(RuntimeWarning, match=r"step_capture=graphs.*eagerly from now on") as w:
        assert c.plan("a", stamp=(0.0125,)) == "eager"
    assert len(w) == 1 and len(str(w[0].message).splitlines()) == 1
    assert c.plan("a", stamp=(0.0125,)) == "eager" and c.broken


def test_a_failure_warns_once_and_everything_runs_eagerly():
    c = StepCache("compile", capture_after=1)
    assert c.plan("a") == "capture"
    with pytest.warns(RuntimeWarning) as w:
        c.fail(RuntimeError("inductor exploded\nwith a long traceback"), "compilation")
        c.fail(RuntimeError("again"), "compilation")
    assert len(w) == 1
    text = str(w[0].message)
    assert text.count("\n") == 0 and "inductor exploded" in text and "compilation" in text
    assert c.plan("a") == "eager" and c.plan("b") == "eager"
    assert c.record()["fallback"].startswith("compilation: RuntimeError")


def test_auto_and_the_config_keys():
    assert capture.resolve("auto", "cpu") == "off"
    assert capture.resolve("compile", "cpu") == "compile"
    cfg = update_dataclass(TrainConfig(), {"step_capture": "compile", "capture_slots": 4},
                           "train", "test")
    cfg.validate()
    with pytest.raises(ConfigError, match="step_capture"):
        update_dataclass(TrainConfig(), {"step_capture": "cudagraphs"}, "train", "test").validate()
    with pytest.raises(ConfigError, match="capture_slots"):
        update_dataclass(TrainConfig(), {"capture_slots": 0}, "train", "test").validate()


def test_step_capture_is_not_part_of_a_runs_identity():
    from lstmablate.recipes import resolve_config

    dyck = get_task("dyck")
    a = resolve_config(dyck, "lstm", overrides=["train.step_capture=compile"])
    b = resolve_config(dyck, "lstm", overrides=["train.step_capture=off",
                                               "train.capture_slots=3"])
    assert a.identity() == b.identity()
    assert "step_capture" not in a.identity()["train"]
    c = resolve_config(dyck, "lstm", overrides=["train.lr=0.5"])
    assert c.identity() != a.identity()


# ---------------------------------------------------------------------------------------
# the trainer's handle: padding, graphs' flow, compile's fallback
# ---------------------------------------------------------------------------------------

class PaddingTask:
    """A stand-in task whose batches are (B, T) token tensors it pads with -1."""

    def batch_length(self, batch):
        return batch.shape[1]

    def pad_batch(self, batch, length):
        return torch.nn.functional.pad(batch, (0, length - batch.shape[1]), value=-1)

    def loss(self, model, batch, carry):
        real = (batch >= 0).to(F64)
        loss = (model(batch.clamp(min=0).to(F64).unsqueeze(-1)).squeeze(-1) * real).sum()
        return StepOutput(loss, None, weight=real.sum())


def test_batches_pad_to_buckets_chosen_from_the_first_epoch():
    task = PaddingTask()
    plan = [torch.zeros(2, n, dtype=torch.long) for n in (3, 3, 4, 9, 9, 10, 17)]
    cap = StepCapture("compile", task, torch.device("cpu"), slots=3)
    assert cap.prepare(plan) == choose_buckets([3, 3, 4, 9, 9, 10, 17], 3) == (4, 10, 17)
    padded = cap.pad(torch.ones(2, 3, dtype=torch.long))
    assert padded.shape == (2, 4) and padded[:, 3].eq(-1).all()
    assert cap.pad(torch.ones(2, 20, dtype=torch.long)).shape == (2, 20)  # longer: as it is
    # the shapes to compile: the most frequent after padding (two of length 10, one each of
    # 4 and 17; a tie goes to the first seen)
    shapes = {capture.shape_key(torch.zeros(2, n, dtype=torch.long), device=False): n
              for n in (4, 10, 17)}
    assert sorted(shapes[k] for k in cap.cache.allowed) == [4, 10, 17]
    cap2 = StepCapture("compile", task, torch.device("cpu"), slots=1)
    assert cap2.prepare(plan) == (17,)  # one slot: one bucket, every batch padded to it
    assert [shapes.get(k) for k in cap2.cache.allowed] == [17]
    off = StepCapture("off", task, torch.device("cpu"))
    assert off.prepare(plan) == () and off.pad(plan[0]) is plan[0]


def test_graphs_off_a_gpu_or_with_a_reason_run_eagerly_with_one_line():
    with pytest.warns(RuntimeWarning, match="CUDA graphs need a CUDA device"):
        cap = StepCapture("graphs", PaddingTask(), torch.device("cpu"))
    assert cap.mode == "off" and cap.step(lambda b, c: 1 / 0, None, None) is None
    with pytest.warns(RuntimeWarning, match="fp16's gradient scaler"):
        cap = StepCapture("graphs", PaddingTask(), torch.device("cuda"),
                          why_not="fp16's gradient scaler reads the host at every step")
    assert not cap.on


class StandInSlot:
    """What ``GraphSlot.record`` would keep, replaying by running the step on static copies
    of the inputs: a replay sees only what was copied into them."""

    recorded = 0

    def __init__(self, body, batch, carry):
        self.body = body
        self.batch, self.carry = batch.clone(), carry

    @classmethod
    def record(cls, body, batch, carry, optimizer, device):
        cls.recorded += 1
        if getattr(cls, "fail", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        return cls(body, batch, carry)

    def replay(self, batch, carry):
        self.batch.copy_(batch)
        return self.body(self.batch, self.carry)


def _graphs_run(monkeypatch, lrs, fail=False):
    """Steps of a linear model through ``StepCapture.step`` with the stand-in recorder."""
    monkeypatch.setattr(capture, "GraphSlot", StandInSlot)
    StandInSlot.recorded, StandInSlot.fail = 0, fail
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=lrs[0])
    task = PaddingTask()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cap = StepCapture("graphs", task, torch.device("cuda"), opt, slots=2)

    def body(batch, carry):
        opt.zero_grad(set_to_none=True)
        out = task.loss(model, batch, carry)
        out.loss.backward()
        opt.step()
        return out.loss.detach(), out.loss.detach(), None, out.weight

    losses, hows = [], []
    gen = torch.Generator().manual_seed(1)
    for lr in lrs:
        for g in opt.param_groups:
            g["lr"] = lr
        batch = torch.randint(0, 5, (2, 3), generator=gen)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = cap.step(body, batch, None)
            w.extend(caught)
        hows.append("eager" if res is None else "graph")
        losses.append(float((res or body(batch, None))[0]))
    return losses, [p.detach().clone() for p in model.parameters()], hows, cap, w


def test_graphs_capture_replay_and_record_again_with_the_eager_numbers(monkeypatch):
    lrs = [0.1] * 4 + [0.05] * 3
    losses, params, hows, cap, w = _graphs_run(monkeypatch, lrs)
    # the second sighting records (its step runs eagerly first); a new rate drops the graph,
    # and the shape, known to recur, is recorded again at once
    assert hows == ["eager"] + ["graph"] * 6
    assert StandInSlot.recorded == 2 and cap.cache.invalidations == 1 and not w
    assert cap.cache.replays == 4
    # the same steps, eagerly
    monkeypatch.setattr(capture, "GraphSlot", None)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for lr, got in zip(lrs, losses):
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        out = PaddingTask().loss(model, torch.randint(0, 5, (2, 3), generator=gen), None)
        out.loss.backward()
        opt.step()
        assert float(out.loss.detach()) == got
    for a, b in zip(model.parameters(), params):
        assert torch.equal(a, b)


def test_a_failed_recording_warns_once_and_the_steps_go_on(monkeypatch):
    losses, params, hows, cap, w = _graphs_run(monkeypatch, [0.1] * 5, fail=True)
    assert hows == ["eager", "graph", "eager", "eager", "eager"]  # (the capturing step ran)
    assert StandInSlot.recorded == 1
    assert [str(x.message).count("\n") for x in w] == [0] and "CUDA-graph capture" in str(
        w[0].message)
    assert cap.record()["fallback"]


def test_a_failed_compilation_warns_once_and_the_step_is_the_eager_one(monkeypatch):
    def broken(*args, **kwargs):
        def fn(*a, **k):
            raise RuntimeError("no C++ compiler")
        return fn

    monkeypatch.setattr(torch, "compile", broken)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1).double()
    cap = StepCapture("compile", PaddingTask(), torch.device("cpu"), capture_after=1)
    batch = torch.tensor([[1, 2, 3]])
    with pytest.warns(RuntimeWarning, match="compilation failed.*no C.. compiler"):
        out = cap.loss(model, batch, None)
    assert float(out.loss) == float(PaddingTask().loss(model, batch, None).loss)
    assert cap.mode == "compile" and cap.cache.broken
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap.loss(model, batch, None)  # eagerly, silently


# ---------------------------------------------------------------------------------------
# the encoder as one operator
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm-srnn", {}), ("gru", {})])
def test_the_encoder_operator_passes_opcheck(name, opts):
    """The operator's fake kernel (shapes, strides), its autograd (through its backward
    operator) and its schema, as torch.library.opcheck tests them."""
    torch.manual_seed(0)
    enc = build_encoder(name, 3, 4, num_layers=2, bidirectional=True, **opts).double().eval()
    x = torch.randn(2, 5, 3, dtype=F64, requires_grad=True)
    lengths = torch.tensor([5, 3])
    params = list(enc.parameters())
    needs = [True] * (1 + len(params))  # x and every parameter (no initial state)
    args = (id(enc), x, lengths, [], [], [], params, False, needs, "")
    torch.library.opcheck(custom_ops.encoder_op, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    res = custom_ops.encoder_op(*args)
    out, final = enc(x, lengths)
    torch.testing.assert_close(res[0], out, atol=1e-12, rtol=0)
    g = torch.randn(out.shape, dtype=F64)
    grads = torch.autograd.grad((res[0] * g).sum(), [x, *params])
    want = torch.autograd.grad((out * g).sum(), [x, *params])
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_the_backward_operator_never_hands_back_one_of_its_inputs():
    """A gradient that autograd passes through unchanged (here through a copy: on a GPU, the
    NMT encoder's) is the outputs' gradient itself; a custom operator may not return its
    input (PyTorch refuses, and the compiled step fell back to eager), so the operator
    returns an equal copy; two outputs that would share memory are made two."""
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    token = next(custom_ops._TOKENS)
    custom_ops._PENDING[token] = ([x.clone()], [x])
    g = torch.randn(3, 4, dtype=F64)
    (got,) = custom_ops.encoder_backward_op(torch.tensor(token), [g], [x])
    assert torch.equal(got, g) and got.untyped_storage().data_ptr() != g.untyped_storage().data_ptr()
    a, b = torch.randn(2, dtype=F64), torch.randn(5, dtype=F64)
    outs = custom_ops._unaliased([a, b, b, a[:1]], [a])
    assert [torch.equal(o, w) for o, w in zip(outs, [a, b, b, a[:1]])] == [True] * 4
    ptrs = [o.untyped_storage().data_ptr() for o in outs]
    assert len(set(ptrs)) == 4 and ptrs[1] == b.untyped_storage().data_ptr()
    assert custom_ops._unaliased([b], [torch.empty(0)])[0] is b


# ---------------------------------------------------------------------------------------
# compile, every task (slow: inductor compiles C++ on the CPU)
# ---------------------------------------------------------------------------------------

#: (task, data, model, data dir) of a tiny training step with dropout on each task's fixtures
TASKS = {
    "ptb": (dict(batch_size=4, num_steps=6, verify=False),
            dict(hidden_size=8, num_layers=2, dropout=0.3), FIXTURES),
    "dyck": (dict(k=2, m=3, train_tokens=0, train_sequences=32, dev_sequences=8,
                  test_sequences=8, train_max_length=12, batch_size=8),
             dict(embedding_dim=8, hidden_size=8, num_layers=2, dropout=0.3), FIXTURES),
    "sst": (dict(verify=False, batch_size=3),
            dict(embedding_size=8, hidden_size=6, mlp_hidden=8, dropout=0.3,
                 encoder_dropout=0.3, num_layers=2), FIXTURES),
    "parsing": (dict(files="parsing", n_buckets=3, batch_tokens=60),
                dict(word_size=8, tag_size=8, hidden_size=8, num_layers=2, arc_mlp=8,
                     rel_mlp=4), FIXTURES),
    "nmt": (dict(verify=False, batch_size=4),
            dict(word_vec_size=8, hidden_size=8, dropout=0.3), FIXTURES / "nmt"),
    "bwb": (dict(batch_size=4, num_steps=5, vocab_size=0),
            dict(emb_size=8, hidden_size=12, proj_size=6, num_sampled=6, dropout=0.3),
            FIXTURES / "bwb"),
    "squad-drqa": (dict(verify=False),
                   dict(embedding_dim=8, hidden_size=6, doc_layers=2, question_layers=1),
                   FIXTURES / "squad"),
}


def _tiny_task(name):
    cls = get_task(name)
    data, model, data_dir = TASKS[name]
    task = cls(update_dataclass(cls.DataConfig(), data, "data", "test"),
               update_dataclass(cls.ModelConfig(), model, "model", "test"), data_dir, seed=1)
    task.use_artefacts(json.loads(json.dumps(task.build_artefacts())))
    task.setup(["train"])
    return task


def _steps(task, mode, n=4):
    """``n`` SGD steps (clipped) of a float64 ``lstm`` model through ``StepCapture`` in
    ``mode``, each shape compiled at its first sighting; the losses and the parameters."""
    torch.manual_seed(0)
    model = task.build_model(functools.partial(build_encoder, "lstm")).double().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cap = StepCapture(mode, task, torch.device("cpu"), opt, slots=4, capture_after=1)
    plan = task.train_plan(0, torch.Generator().manual_seed(1))
    carry = task.init_carry(model)
    carry = carry if carry is None else torch.utils._pytree.tree_map(
        lambda t: t.double() if torch.is_tensor(t) and t.is_floating_point() else t, carry)
    torch.manual_seed(2)
    losses = []
    for i in range(n):
        batch = plan[i % len(plan)]
        batch = torch.utils._pytree.tree_map(
            lambda t: t.double() if torch.is_tensor(t) and t.is_floating_point() else t, batch)
        opt.zero_grad(set_to_none=True)
        out = cap.loss(model, batch, carry)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        carry = out.carry
        losses.append(out.loss.detach())
    return losses, [p.detach().clone() for p in model.parameters()], cap


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_tasks_compiled_step_equals_the_eager_step(name):
    if name == "squad-drqa":
        pytest.importorskip("spacy")
    task = _tiny_task(name)
    eager_losses, eager_params, _ = _steps(task, "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: it did compile
        losses, params, cap = _steps(task, "compile")
    assert cap.cache.captures >= 1 and not cap.cache.broken, cap.record()
    for a, b in zip(losses, eager_losses):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    for a, b in zip(params, eager_params):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert any(not torch.equal(a, b) for a, b in zip(params, _steps(task, "off", n=1)[1]))


@pytest.mark.slow
def test_a_compiled_run_interrupted_and_resumed_ends_where_an_uninterrupted_one_ends(
        tmp_path, tiny_recipe):
    """Through the trainer: dyck, two layers with dropout; one run of 6 steps, one stopped
    after 3 steps (its last.pt) and resumed in a new trainer; the same parameters, bit for
    bit, and the same metrics file."""
    from lstmablate.recipes import resolve_config
    from lstmablate.run.runner import build_model, make_task, seed_everything
    from lstmablate.run.runs import RunFiles
    from lstmablate.train.trainer import Trainer

    cfg = resolve_config(get_task("dyck"), "lstm", recipe=str(tiny_recipe), overrides=[
        "train.step_capture=compile", "train.max_steps=6", "train.eval_every=2",
        "train.max_epochs=1", "model.num_layers=2", "model.dropout=0.3", "train.eval_test=false"])

    def trainer(out, stop_after=None):
        seed_everything(cfg.seed)
        task = make_task(cfg, FIXTURES, out)
        task.use_artefacts(task.build_artefacts())
        task.setup(["train", task.dev_split])
        model = build_model(task, cfg)
        t = Trainer(cfg.train, task, model, RunFiles(out), seed=cfg.seed,
                    device=torch.device("cpu"), identity=cfg.checkpoint_key(), progress=False)
        if stop_after is not None:
            step = t._train_step

            def stopping(batch):
                loss = step(batch)
                if t.pos.step >= stop_after:
                    t._stop_signal = "SIGINT"
                return loss
            t._train_step = stopping
        return t, model

    full, model_full = trainer(tmp_path / "full")
    full.fit()
    part, _ = trainer(tmp_path / "part", stop_after=3)
    assert part.fit().interrupted
    resumed, model_resumed = trainer(tmp_path / "part")
    resumed.fit(resume=True)
    assert resumed.capture.cache.captures >= 1 and not resumed.capture.cache.broken
    for a, b in zip(model_full.parameters(), model_resumed.parameters()):
        assert torch.equal(a, b)
    assert (RunFiles(tmp_path / "part").metrics.read_bytes()
            == RunFiles(tmp_path / "full").metrics.read_bytes())
