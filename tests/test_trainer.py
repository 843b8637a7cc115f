"""The task-agnostic trainer on a toy task: loss falls, schedules, clipping,
early stopping, NaN guard, checkpoints, exact resume."""

from __future__ import annotations

import functools
import json
import os
import signal
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from lstmablate.batching import BatchPlan, contiguous_groups
from lstmablate.cells import build_encoder
from lstmablate.config import TrainConfig
from lstmablate.errors import ConfigError
from lstmablate.task import Metric, StepOutput, Task
from lstmablate.run.runs import RunFiles
from lstmablate.train import Trainer
from lstmablate.train.checkpoint import load_checkpoint
from lstmablate.train.optim import Schedule
from lstmablate.train.step import TrainingDiverged


@dataclass
class ToyData:
    n: int = 96
    batch_size: int = 16


@dataclass
class ToyModel:
    hidden: int = 8


class ToyTask(Task):
    """Predict the running mean of a random sequence (needs memory of the past)."""

    name = "toy"
    DataConfig, ModelConfig = ToyData, ToyModel
    metrics = (Metric("mse", False),)
    primary = metrics[0]

    def setup(self, splits=("train", "dev", "test")):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.data_cfg.n, 12, 1, generator=g)
        y = x.cumsum(1) / torch.arange(1, 13).view(1, 12, 1)
        self.data = {"train": (x, y), "dev": (x[:32], y[:32]), "test": (x[32:64], y[32:64])}

    collated = 0  # batches built so far (a resumed run must not build the skipped ones)

    def train_plan(self, epoch, generator):
        x, y = self.data["train"]
        order = torch.randperm(len(x), generator=generator).tolist()
        groups = contiguous_groups(len(x), self.data_cfg.batch_size, order)

        def collate(idx):
            self.collated += 1
            return x[idx], y[idx]
        return BatchPlan(groups, collate)

    def build_model(self, make_encoder):
        class M(nn.Module):
            def __init__(s):
                super().__init__()
                s.enc = make_encoder(1, self.model_cfg.hidden)
                s.drop = nn.Dropout(0.1)  # so the RNG state matters for exact resume
                s.out = nn.Linear(self.model_cfg.hidden, 1)

            def forward(s, x):
                return s.out(s.drop(s.enc(x)[0]))
        return M()

    def loss(self, model, batch, carry):
        x, y = batch
        return StepOutput(nn.functional.mse_loss(model(x), y))

    def evaluate(self, model, split, final=False):
        x, y = self.data[split]
        return {"mse": float(nn.functional.mse_loss(model(x), y).detach())}


def make_trainer(tmp_path, cfg: TrainConfig, name="run", seed=3, **kwargs):
    torch.manual_seed(seed)
    task = ToyTask(ToyData(), ToyModel(), tmp_path, seed=seed)
    task.setup()
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    kwargs.setdefault("progress", False)
    return Trainer(cfg, task, model, RunFiles(tmp_path / name), seed=seed, device=torch.device("cpu"),
                   identity={"task": "toy", "cell": "lstm", "experiment": "t", "seed": seed},
                   **kwargs)


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_loss_falls_and_files_are_written(tmp_path):
    tr = make_trainer(tmp_path, TrainConfig(optimizer="adam", lr=0.02, max_epochs=6))
    res = tr.fit()
    rows = read_metrics(tr.metrics_path)
    assert len(rows) == 6 and [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["mse"] < 0.5 * rows[0]["mse"]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert res.steps == 6 * 6 and res.test is not None
    best = min(rows, key=lambda r: r["mse"])
    assert res.best["dev"]["mse"] == pytest.approx(best["mse"])
    assert load_checkpoint(tr.best_path)["step"] == best["step"]
    assert load_checkpoint(tr.last_path)["position"]["done"] is True


def test_max_steps_and_eval_every(tmp_path):
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.1, max_epochs=50, max_steps=10,
                                            eval_every=4))
    res = tr.fit()
    assert res.steps == 10
    assert [r["step"] for r in read_metrics(tr.metrics_path)] == [4, 8, 10]


def test_early_stopping(tmp_path):
    # lr 0 never improves after the first evaluation
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.0, max_epochs=20, patience=2))
    tr.fit()
    assert len(read_metrics(tr.metrics_path)) == 3


def test_epoch_decay_matches_the_tensorflow_tutorial():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    s = Schedule(TrainConfig(lr=1.0, schedule="epoch_decay", decay=0.5, decay_start=4), opt)
    # TF: lr * decay ** max(i + 1 - max_epoch, 0) for 0-based epoch i
    assert [s.lr_at(e, 0) for e in range(7)] == [1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.125]
    s = Schedule(TrainConfig(lr=2e-3, schedule="exponential", decay=0.75, decay_steps=5000), opt)
    assert s.lr_at(0, 10000) == pytest.approx(2e-3 * 0.75 ** 2)
    s = Schedule(TrainConfig(lr=1.0, schedule="plateau", decay=0.5, plateau_patience=1), opt)
    for improved in (True, False, False, False, False):
        s.observe(improved)
    assert s.lr_at(0, 0) == 0.25


def test_clipping_bounds_the_update(tmp_path):
    cfg = TrainConfig(optimizer="sgd", lr=1.0, clip_norm=1e-3, max_epochs=1, max_steps=1, eval_test=False)
    tr = make_trainer(tmp_path, cfg)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    delta = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(tr.model.parameters(), before)))
    assert delta.item() == pytest.approx(1e-3, rel=1e-4)  # lr 1 x clipped norm


def test_clip_scope_clips_only_the_named_module(tmp_path):
    """train.clip_scope=enc: the recurrent layers' gradients are clipped to the norm, the rest
    are applied as computed (Jozefowicz et al.'s code clips the LSTM's gradients only)."""
    cfg = TrainConfig(optimizer="sgd", lr=1.0, clip_norm=1e-3, clip_scope="enc", max_epochs=1,
                      max_steps=1, eval_test=False)
    tr = make_trainer(tmp_path, cfg)
    names = [n for n, _ in tr.model.named_parameters()]
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    delta = {n: ((p.detach() - b) ** 2).sum() for n, p, b in zip(names, tr.model.parameters(), before)}
    enc = torch.sqrt(sum(v for n, v in delta.items() if n.startswith("enc.")))
    out = torch.sqrt(sum(v for n, v in delta.items() if n.startswith("out.")))
    assert enc.item() == pytest.approx(1e-3, rel=1e-4)
    assert out.item() > 1e-2  # not clipped
    with pytest.raises(ConfigError, match="clip_scope 'encoder' names no parameter.*enc, out"):
        make_trainer(tmp_path, TrainConfig(clip_norm=1.0, clip_scope="encoder"), name="bad")


def test_adagrad_starts_from_the_initial_accumulator():
    """TF's Adagrad: acc = acc0 + g^2; w -= lr g / sqrt(acc)."""
    from lstmablate.train.optim import build_optimizer

    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = build_optimizer(TrainConfig(optimizer="adagrad", lr=0.2, initial_accumulator=1.0,
                                      eps=1e-12), [w])
    w.grad = torch.tensor([3.0, 0.5])
    opt.step()
    expected = torch.tensor([1.0 - 0.2 * 3.0 / (1 + 9.0) ** 0.5, -2.0 - 0.2 * 0.5 / (1 + 0.25) ** 0.5])
    torch.testing.assert_close(w.detach(), expected)


def test_nonfinite_loss_stops_or_skips(tmp_path):
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.1, max_epochs=2), name="stop")
    real_loss = tr.task.loss
    calls = {"n": 0}

    def poisoned(model, batch, carry):
        calls["n"] += 1
        out = real_loss(model, batch, carry)
        if calls["n"] == 8:
            out.loss = out.loss * float("nan")
        return out

    tr.task.loss = poisoned
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 8 .*last finite loss"):
        tr.fit()
    assert tr.best_path.exists() and tr.last_path.exists()  # epoch-1 checkpoints kept

    calls["n"] = 0
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.1, max_epochs=2, nonfinite="skip"),
                      name="skip")
    tr.task.loss = poisoned
    res = tr.fit()
    assert res.skipped_nonfinite == 1 and res.steps == 11


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=3, eval_every=5)
    full = make_trainer(tmp_path, cfg, name="full")
    full.fit()

    part = make_trainer(tmp_path, cfg, name="part")
    real_step = part._train_step

    def interrupt_at_7(batch):
        out = real_step(batch)
        if part.pos.step == 7:
            part._stop_signal = "SIGINT"
        return out

    part._train_step = interrupt_at_7
    res = part.fit()
    assert res.interrupted and load_checkpoint(part.last_path)["position"]["step"] == 7

    resumed = make_trainer(tmp_path, cfg, name="part", seed=3)
    torch.manual_seed(12345)  # the checkpoint's RNG state must win over this
    resumed.fit(resume=True)
    assert resumed.metrics_path.read_bytes() == full.metrics_path.read_bytes()
    # the plan jumped to the saved position: batches 1-7 were never built again
    assert full.task.collated == 18 and resumed.task.collated == 18 - 7


class Killed(Exception):
    """A process killed outright (SIGKILL, a lost machine): nothing runs after it, no save."""


def killed_at(trainer, step):
    real_step = trainer._train_step

    def step_or_die(batch):
        if trainer.pos.step + 1 == step:
            raise Killed
        return real_step(batch)
    trainer._train_step = step_or_die
    return trainer


def test_last_pt_is_saved_between_evaluations_every_save_every_minutes(tmp_path, monkeypatch):
    """Wall-clock minutes from the start of training or the last save: a clock that moves 2.5
    minutes per step and a period of 5 save every second step within an epoch; the epoch's
    evaluation saves and restarts the count; the epoch's last batch is left to it."""
    from lstmablate.train import saving, trainer as trainer_module

    clock = {"t": 1000.0}
    fake = type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock["t"]),
                                 "process_time": staticmethod(lambda: 0.0)})
    monkeypatch.setattr(saving, "time", fake)
    monkeypatch.setattr(trainer_module, "time", fake)
    # 6 batches an epoch, 3 epochs, evaluated at each epoch's end
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.1, max_epochs=3,
                                            save_every_minutes=5))
    real_step, real_save = tr._train_step, tr._save_last
    saves = []

    def step(batch):
        clock["t"] += 150.0
        return real_step(batch)

    def save():
        saves.append((tr.pos.epoch, tr.pos.batch))
        real_save()
    tr._train_step, tr._save_last = step, save
    tr.fit()
    # (epoch, batch) at each save: 2 and 4 by the clock, the evaluation's at the epoch's end
    # (batch 6 of epoch e is saved as epoch e + 1, batch 0), then the run's final save
    assert saves == [(0, 2), (0, 4), (1, 0), (1, 2), (1, 4), (2, 0), (2, 2), (2, 4), (3, 0),
                     (3, 0)]


def test_a_run_killed_outright_resumes_exactly_from_its_save_between_evaluations(tmp_path):
    """A kill that gives the run no chance to save (SIGKILL) mid-epoch: with a save after
    every step, last.pt holds the step before the kill, and --resume from it writes the
    metrics of an uninterrupted run; with the periodic save off it holds the last epoch's."""
    every_step = TrainConfig(optimizer="adam", lr=0.01, max_epochs=3, save_every_minutes=1e-9)
    full = make_trainer(tmp_path, every_step, name="full")
    full.fit()

    part = killed_at(make_trainer(tmp_path, every_step, name="part"), step=10)
    with pytest.raises(Killed):
        part.fit()
    position = load_checkpoint(part.last_path)["position"]
    assert (position["step"], position["epoch"], position["batch"]) == (9, 1, 3)
    resumed = make_trainer(tmp_path, every_step, name="part")
    resumed.fit(resume=True)
    assert resumed.metrics_path.read_bytes() == full.metrics_path.read_bytes()

    off = TrainConfig(optimizer="adam", lr=0.01, max_epochs=3, save_every_minutes=0)
    part = killed_at(make_trainer(tmp_path, off, name="off"), step=10)
    with pytest.raises(Killed):
        part.fit()
    position = load_checkpoint(part.last_path)["position"]
    assert (position["step"], position["epoch"], position["batch"]) == (6, 1, 0)


def test_sigterm_twice_still_saves_and_resumes_exactly_a_second_ctrl_c_gives_up(tmp_path):
    """Slurm signals every process of a job and srun forwards signals too, so a run can get
    SIGTERM more than once: the second one must not abandon the save of last.pt.  A second
    Ctrl-C (SIGINT) still stops at once."""
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=3, eval_every=5)
    full = make_trainer(tmp_path, cfg, name="full")
    full.fit()

    def signalled_at_7(trainer, sig):
        real_step = trainer._train_step

        def step(batch):
            out = real_step(batch)
            if trainer.pos.step == 7:
                os.kill(os.getpid(), sig)  # the handler runs before the next line
                os.kill(os.getpid(), sig)
            return out
        trainer._train_step = step
        return trainer

    part = signalled_at_7(make_trainer(tmp_path, cfg, name="part"), signal.SIGTERM)
    assert part.fit().interrupted and load_checkpoint(part.last_path)["position"]["step"] == 7
    resumed = make_trainer(tmp_path, cfg, name="part")
    resumed.fit(resume=True)
    assert resumed.metrics_path.read_bytes() == full.metrics_path.read_bytes()

    ctrl_c = signalled_at_7(make_trainer(tmp_path, cfg, name="ctrl-c"), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.fit()
    assert signal.getsignal(signal.SIGTERM) != ctrl_c._on_signal  # handlers restored


def test_test_checkpoint_last_uses_the_final_model(tmp_path):
    cfg = TrainConfig(optimizer="adam", lr=0.05, max_epochs=3, test_checkpoint="last")
    tr = make_trainer(tmp_path, cfg, name="last")
    res = tr.fit()
    # evaluated as the trainer evaluates (no autograd: the cells' inference paths), so equal
    with torch.no_grad():
        assert res.test == tr.task.evaluate(tr.model.eval(), "test")  # the model as training left it
    best = make_trainer(tmp_path, TrainConfig(optimizer="adam", lr=0.05, max_epochs=3), name="best")
    res_best = best.fit()
    best.model.load_state_dict(load_checkpoint(best.best_path)["model"])
    with torch.no_grad():
        assert res_best.test == best.task.evaluate(best.model.eval(), "test")


SCHEDULES = {
    "constant": dict(schedule="constant"),
    "epoch_decay": dict(schedule="epoch_decay", decay=0.5, decay_start=1),
    "plateau": dict(schedule="plateau", decay=0.5, plateau_patience=0, patience=3),
    "exponential": dict(schedule="exponential", decay=0.5, decay_steps=5),
}


def _interrupted_at(tmp_path, cfg, name, step):
    part = make_trainer(tmp_path, cfg, name=name)
    real_step = part._train_step

    def interrupt(batch):
        out = real_step(batch)
        if part.pos.step == step:
            part._stop_signal = "SIGINT"
        return out

    part._train_step = interrupt
    assert part.fit().interrupted
    resumed = make_trainer(tmp_path, cfg, name=name)
    torch.manual_seed(999)
    return resumed, resumed.fit(resume=True)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("eval_every", [0, 4], ids=["per-epoch", "every-4-steps"])
def test_resume_is_exact_under_every_schedule_and_eval_cadence(tmp_path, schedule, eval_every):
    """Interrupted at several points (mid-epoch, at an epoch's end, right after an evaluation),
    every resumed run writes the uninterrupted run's metrics and result."""
    cfg = TrainConfig(optimizer="sgd", lr=1.0, momentum=0.9, max_epochs=3, eval_every=eval_every,
                      **SCHEDULES[schedule])
    full = make_trainer(tmp_path, cfg, name="full")
    expected = full.fit()
    rows = read_metrics(full.metrics_path)
    if schedule == "plateau":
        assert len({r["lr"] for r in rows}) > 1, "the test should see a plateau decay"
    for step in (3, 6, 8, 13):
        resumed, res = _interrupted_at(tmp_path, cfg, f"part-{step}", step)
        assert resumed.metrics_path.read_bytes() == full.metrics_path.read_bytes(), step
        assert (res.best, res.test, res.steps) == (expected.best, expected.test, expected.steps)


def test_final_evaluation_and_epoch_count_are_labelled_with_their_epoch(tmp_path):
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=2, eval_every=4)  # 12 steps
    tr = make_trainer(tmp_path, cfg)
    res = tr.fit()
    rows = read_metrics(tr.metrics_path)
    assert [r["step"] for r in rows] == [4, 8, 12] and rows[-1]["epoch"] == 2
    assert res.epochs_completed == 2
    short = make_trainer(tmp_path, TrainConfig(optimizer="adam", lr=0.01, max_epochs=5,
                                               max_steps=3), name="short")
    res = short.fit()
    assert res.epochs_completed == 1 and res.best["epoch"] == 1


def test_epoch_decay_also_starts_when_the_dev_metric_gets_worse():
    """OpenNMT-py: halve from epoch 8 on, or from the epoch after the first worse perplexity."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = TrainConfig(lr=1.0, schedule="epoch_decay", decay=0.5, decay_start=8, decay_on_worse=True)
    s = Schedule(cfg, opt)
    for epoch, ppl in enumerate([50.0, 40.0, 30.0], 1):  # improving: the epoch rule alone
        s.observe(True, ppl, epoch)
    assert [s.lr_at(i, 0) for i in range(10)] == [1.0] * 8 + [0.5, 0.25]
    s.observe(False, 31.0, 4)  # epoch 4 got worse: epoch 5 (0-based 4) onwards halves
    s.observe(True, 20.0, 5)  # and keeps halving even when it improves again
    assert [s.lr_at(i, 0) for i in range(7)] == [1.0] * 4 + [0.5, 0.25, 0.125]
    restored = Schedule(cfg, opt)
    restored.load_state_dict(s.state_dict())
    assert restored.lr_at(6, 0) == 0.125
    plain = Schedule(TrainConfig(lr=1.0, schedule="epoch_decay", decay=0.5, decay_start=8), opt)
    plain.observe(False, 99.0, 1)
    plain.observe(False, 100.0, 2)
    assert plain.lr_at(5, 0) == 1.0  # without decay_on_worse the rule is off


def test_train_loss_is_the_logged_loss_on_the_evaluation_scale(tmp_path):
    """train_loss is the mean of StepOutput.logged since the last evaluation (e.g. PTB's NLL
    per token), not of the optimised loss (PTB's sum over time steps)."""
    seen = {"logged": [], "loss": []}

    def scaled(task_loss):
        def loss(model, batch, carry):
            out = task_loss(model, batch, carry)
            out.logged, out.loss = out.loss.detach(), out.loss * 7.0
            seen["logged"].append(float(out.logged))
            return out
        return loss

    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.01, max_epochs=1))
    tr.task.loss = scaled(tr.task.loss)
    tr.fit()
    (row,) = read_metrics(tr.metrics_path)
    assert row["train_loss"] == pytest.approx(sum(seen["logged"]) / len(seen["logged"]), rel=1e-12)


@pytest.mark.parametrize("poison_at", [None, 8])
def test_deferred_host_reads_train_identically_and_still_stop_at_the_bad_step(tmp_path, poison_at):
    """The CUDA mode that reads nothing back per step (forced here on CPU): the same
    metrics.jsonl, bit for bit, as reading every step; a non-finite loss is still named at
    its exact step, and the state it produced is never saved."""
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=2, eval_every=5)
    runs = {}
    for defer in (False, True):
        tr = make_trainer(tmp_path, cfg, name=f"defer-{defer}", defer_host_reads=defer)
        if poison_at:
            real_loss, calls = tr.task.loss, {"n": 0}

            def poisoned(model, batch, carry, real_loss=real_loss, calls=calls):
                calls["n"] += 1
                out = real_loss(model, batch, carry)
                if calls["n"] == poison_at:
                    out.loss = out.loss * float("nan")
                return out
            tr.task.loss = poisoned
            with pytest.raises(TrainingDiverged, match=rf"at step {poison_at} .*last finite loss "
                                                       r"was \d"):
                tr.fit()
            saved = load_checkpoint(tr.last_path)
            assert saved["position"]["step"] == 6  # the end of epoch 1, before the bad step
            assert all(torch.isfinite(v).all() for v in saved["model"].values())
        else:
            tr.fit()
        assert tr._acc.deferred is defer
        runs[defer] = tr.metrics_path.read_bytes()
    assert runs[True] == runs[False]


def test_plain_progress_lines_name_steps_tokens_loss_and_eta(tmp_path):
    """Without a terminal (a pipe, a log file) a line every log_interval seconds."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    tr = make_trainer(tmp_path, TrainConfig(optimizer="sgd", lr=0.01, max_epochs=1),
                      console=Console(file=buf, width=60), log_interval=0.0)
    tr.fit()
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch 1 batch")]
    assert len(lines) == 6  # one per step at log_interval 0 (6 batches of 16)
    assert lines[2].startswith("epoch 1 batch 3/6 step 3: train loss ")
    assert "tokens/s" in lines[2] and "lr 0.01" in lines[2] and "epoch ETA" in lines[2]
    assert all(len(ln) > 60 for ln in lines)  # never wrapped at the console width
