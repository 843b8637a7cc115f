"""The SQuAD tasks through the library entry points behind `lstmablate train` / `eval`: a run
folder with its artefacts, evaluation that reads only the dev split (and no vector file), and
`--write-predictions` giving the same numbers as the run's own final evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lstmablate.task as task_module
from lstmablate.run.runner import evaluate_run, train_run
from lstmablate.run.runs import RunFiles
from lstmablate_tasks.squad.task import BiDAFTask, DrQATask

pytest.importorskip("spacy")  # the readers tokenise with spaCy (data.tokenizer: spacy)

FIXTURE = Path(__file__).parent / "fixtures" / "squad"


class _EntryPoint:
    def __init__(self, cls):
        self.cls = cls

    def load(self):
        return self.cls


@pytest.fixture
def squad_tasks(monkeypatch):
    """The two tasks registered as pyproject.toml registers them (entry points)."""
    real = task_module._entry_points

    def eps():
        found = dict(real())
        found.setdefault("squad-drqa", _EntryPoint(DrQATask))
        found.setdefault("squad-bidaf", _EntryPoint(BiDAFTask))
        return found

    monkeypatch.setattr(task_module, "_entry_points", eps)


def _train(tmp_path, task, overrides):
    out = train_run(task, "lstm-srnn", overrides=["data.verify=false", *overrides],
                    out=tmp_path / "runs", data_dir=str(FIXTURE), progress=False, threads=1)
    assert out.result is not None
    return out


def test_drqa_run_eval_and_predictions(tmp_path, squad_tasks):
    vec = tmp_path / "vectors.txt"
    words = {w for d in ("train", "dev") for a in json.loads(
        (FIXTURE / "squad" / f"{d}-v1.1.json").read_text(encoding="utf-8"))["data"]
        for p in a["paragraphs"] for w in p["context"].split()[:40]}
    vec.write_text("".join(f"{w} " + " ".join(["0.01"] * 8) + "\n" for w in sorted(words)),
                   encoding="utf-8")
    out = _train(tmp_path, "squad-drqa", [
        "model.embedding_dim=8", "model.hidden_size=8", "model.doc_layers=1",
        "model.question_layers=1", f"model.pretrained={vec}", "model.tune_partial=5",
        "train.max_epochs=2", "data.batch_size=10"])
    run = out.run_dir
    artefacts = sorted(p.name for p in RunFiles(run).artefacts.iterdir())
    assert {"words.json", "features.json", "n_tuned.json"} <= set(artefacts)
    assert json.loads((RunFiles(run).artefacts / "n_tuned.json").read_text()) == 7
    vec.unlink()  # evaluation reads the embeddings from the checkpoint, not the vector file
    again = evaluate_run(run, split="dev", data_dir=str(FIXTURE))
    assert again == pytest.approx(out.result.test)
    preds_path = tmp_path / "preds.json"
    scored = evaluate_run(run, split="dev", data_dir=str(FIXTURE), write_predictions=preds_path)
    assert scored == pytest.approx(out.result.test)
    preds = json.loads(preds_path.read_text(encoding="utf-8"))
    assert len(preds) == 13 and all(isinstance(v, str) for v in preds.values())
    longer = evaluate_run(run, split="dev", data_dir=str(FIXTURE), eval_overrides=["eval.max_span=1"])
    assert longer["questions"] == 13


def test_bidaf_run_on_the_standin_split(tmp_path, squad_tasks):
    out = _train(tmp_path, "squad-bidaf", [
        "data.splitting=dev-by-article", "data.standin_dev_articles=1", "model.word_dim=8",
        "model.char_filters=8", "model.hidden_size=8", "train.max_epochs=1"])
    assert out.result.test["questions"] == 5  # the held-out article "Force"
    assert out.result.primary == "em"
    assert evaluate_run(out.run_dir, split="dev", data_dir=str(FIXTURE)) == \
        pytest.approx(out.result.test)
