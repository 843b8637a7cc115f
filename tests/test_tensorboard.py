"""The optional TensorBoard logger: events readable back; a clear error without the package."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from lstmablate.errors import UserError
from lstmablate.run.runs import RunFiles


def test_without_the_package_it_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    from lstmablate.train.tensorboard import TensorBoardLogger, require_tensorboard

    with pytest.raises(UserError, match=r"pip install 'lstmablate\[tensorboard\]'"):
        require_tensorboard()
    with pytest.raises(UserError, match=r"pip install 'lstmablate\[tensorboard\]'"):
        TensorBoardLogger(RunFiles(tmp_path).tensorboard, {"cell": "lstm"})
    assert not RunFiles(tmp_path).tensorboard.exists()


def _read(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_events_of_a_real_run_read_back(tiny_recipe, tmp_path):
    pytest.importorskip("tensorboard")
    from lstmablate.run.runner import train_run
    from lstmablate.train.tensorboard import TensorBoardLogger

    outcome = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs",
                        console=Console(file=io.StringIO()), progress=False, threads=1,
                        overrides=["train.eval_every=2", "train.max_steps=6"])
    run = outcome.run_dir
    records = [json.loads(l) for l in RunFiles(run).metrics.read_text().splitlines()]
    config = {"task": "dyck", "cell": "lstm", "train": {"lr": 0.02}}
    with TensorBoardLogger(RunFiles(run).tensorboard, config, every=2) as tb:
        for step, loss in zip(range(1, 7), [1.0, 3.0, 2.0, 2.0, 0.5, 1.5]):
            tb.log_train(step, loss, lr=0.02)
            if step % 2 == 0:
                tb.log_eval(step, records[step // 2 - 1])
        tb.log_metrics(6, "test", outcome.result.test)
    acc = _read(RunFiles(run).tensorboard)
    tags = acc.Tags()["scalars"]
    assert {"dev/loss", "dev/accuracy", "train/loss", "train/lr", "train/loss_window",
            "progress/epoch", "test/accuracy"} <= set(tags)
    steps = [r["step"] for r in records]
    for tag, key in (("dev/loss", "loss"), ("dev/accuracy", "accuracy"), ("train/loss", "train_loss")):
        got = _scalars(acc, tag)  # float32 in the event file
        assert [s for s, _ in got] == steps
        assert [v for _, v in got] == pytest.approx([r[key] for r in records], rel=1e-6)
    assert _scalars(acc, "train/loss_window") == [(2, 2.0), (4, 2.0), (6, 1.0)]  # mean of 2 steps
    ((step, acc_test),) = _scalars(acc, "test/accuracy")
    assert step == 6 and acc_test == pytest.approx(outcome.result.test["accuracy"], rel=1e-6)
    # the config, as text
    (text,) = acc.Tensors("config/text_summary")
    assert "cell: lstm" in text.tensor_proto.string_val[0].decode()


def test_resume_drops_what_an_interrupted_session_wrote_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from lstmablate.train.tensorboard import TensorBoardLogger

    with TensorBoardLogger(RunFiles(tmp_path).tensorboard, {}, every=1) as tb:
        for step in range(1, 9):  # checkpoint at step 4, killed after step 8
            tb.log_train(step, float(step), lr=1.0)
    with TensorBoardLogger(RunFiles(tmp_path).tensorboard, {}, every=1, purge_step=5) as tb:
        for step in range(5, 7):
            tb.log_train(step, 10.0 * step, lr=1.0)
    acc = _read(RunFiles(tmp_path).tensorboard)
    assert _scalars(acc, "train/loss_window") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0),
                                                  (5, 50.0), (6, 60.0)]


def test_train_tensorboard_flag_logs_the_run(tiny_recipe, tmp_path):
    """`lstmablate train --tensorboard`: the trainer itself writes dev, train and test scalars."""
    pytest.importorskip("tensorboard")
    from lstmablate.run.runner import train_run

    outcome = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs",
                        console=Console(file=io.StringIO()), progress=False, threads=1,
                        overrides=["train.eval_every=2", "train.max_steps=6"], tensorboard=True)
    records = [json.loads(l) for l in RunFiles(outcome.run_dir).metrics.read_text().splitlines()]
    acc = _read(RunFiles(outcome.run_dir).tensorboard)
    dev = _scalars(acc, "dev/loss")
    assert [s for s, _ in dev] == [r["step"] for r in records]
    assert [v for _, v in dev] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    (_, test_acc), = _scalars(acc, "test/accuracy")
    assert test_acc == pytest.approx(outcome.result.test["accuracy"], rel=1e-6)
    assert len(_scalars(acc, "train/loss")) >= 1
