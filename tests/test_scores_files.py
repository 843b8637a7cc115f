"""The run folder's ``scores/<split>.jsonl``: written by every training run's final evaluation,
rewritten from the checkpoint by ``lstmablate eval RUN --scores`` (byte for byte, nothing else
in the run changed), cleared with the run by --force, protected from other outputs, and read
back with one clear message for every kind of damage."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from cli_in_process import run_cli
from lstmablate.errors import DataError, UserError
from lstmablate.run.runner import score_run, train_run
from lstmablate.run.runs import RunFiles, clear_run_dir
from lstmablate.runfolder import check_output
from lstmablate.run.scores import read_scores, reference_digest, write_scores
from lstmablate.task import get_task

QUIET = Console(file=io.StringIO())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny Dyck run trained to the end (its final evaluation writes the scores)."""
    from conftest import TINY_DYCK

    root = tmp_path_factory.mktemp("scores")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_DYCK)
    out = train_run("dyck", "lstm", recipe=str(recipe), seed=1, out=root / "runs", console=QUIET,
                    progress=False, threads=1)
    return RunFiles(out.run_dir)


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RunFiles.LOCK}


def test_training_writes_the_test_scores_and_they_give_its_result(run):
    scores = read_scores(run.scores("test"))
    result = json.loads(run.result.read_text())
    assert scores.header["checkpoint"] == result["test_checkpoint"] == "best"
    assert (scores.header["cell"], scores.header["seed"], scores.split) == ("lstm", 1, "test")
    assert scores.metrics == result["test"]
    assert len(scores.records) == 16  # test_sequences
    task = get_task("dyck")(*_cfg(run), ".")
    for name, metric in task.item_metrics().items():
        assert metric.of(scores.records) == pytest.approx(result["test"][name], rel=1e-5), name
    assert sorted(p.name for p in (run.root / RunFiles.SCORES).iterdir()) == ["test.jsonl"]
    task.setup()  # the header names the test set: the digest of its strings
    assert scores.reference == reference_digest(task.reference_items("test"))
    other = get_task("dyck")(*_cfg(run), ".")
    other.data_cfg.data_seed += 1
    other.setup()  # another draw of the corpus is another test set
    assert reference_digest(other.reference_items("test")) != scores.reference


def _cfg(run):
    from lstmablate.run.record import Run

    cfg = Run.open(run.root).config
    return cfg.data, cfg.model


def test_eval_scores_rewrites_the_same_file_and_nothing_else(run, tmp_path):
    written = run.scores("test").read_bytes()
    run.scores("test").unlink()
    before = _hashes(run.root)
    done = run_cli("eval", run.root, "--split", "test", "--scores", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert run.scores("test").read_bytes() == written  # the checkpoint's evaluation, again
    after = _hashes(run.root)
    assert after.pop(f"{RunFiles.SCORES}/test.jsonl")
    assert after == before
    assert "wrote" in done.stderr and RunFiles.BEST in done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("wcpa_mean"))
    shown = line.split("\t")
    assert shown[1] == shown[2] == shown[3]  # from the scores == this evaluation == result.json
    js = run_cli("eval", run.root, "--scores", "--json", "--split", "dev", cwd=tmp_path)
    got = json.loads(js.stdout)
    assert got["path"].endswith("scores/dev.jsonl") and got["from_scores"]["accuracy"] == \
        pytest.approx(got["metrics"]["accuracy"])


def test_eval_scores_refuses_what_would_not_match_the_result(run, tmp_path):
    for extra, what in ((["--checkpoint", "last"], "leave out --checkpoint"),
                        (["--set", "eval.batch_size=2"], "leave out --checkpoint, --set")):
        done = run_cli("eval", run.root, "--scores", *extra, cwd=tmp_path)
        assert done.returncode == 2 and what in done.stderr
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in (RunFiles.CONFIG, RunFiles.BEST):
        (unfinished / name).write_bytes((run.root / name).read_bytes())
    with pytest.raises(UserError, match="has no result.json: the run is not finished"):
        score_run(unfinished)


def test_force_clears_scores_and_outputs_never_go_into_the_scores_folder(tmp_path):
    files = RunFiles(tmp_path / "run")
    files.root.mkdir()
    files.config.write_text("task: dyck\nexperiment: x\ncell: lstm\n")
    write_scores(files.scores("test"), {"task": "dyck", "experiment": "x", "cell": "lstm",
                                        "seed": 1, "split": "test", "checkpoint": "best",
                                        "metrics": {}}, [{"id": 0}])
    with pytest.raises(UserError, match="is a file of the run folder"):
        check_output([files.scores("test")], option="--write-predictions", force=True)
    clear_run_dir(files)
    assert not files.scores("test").exists()


@pytest.mark.parametrize("text, line, what", [
    ("", 1, "the file is empty"),
    ('{"scores": 1}\n', 1, "with task, experiment"),
    ('{"scores": 2, "task": 1}\n', 1, 'expected the header {"scores": 1'),
    ("HEADER\n{\"id\": 0}\nnot json\n", 3, "not a JSON object"),
    ("HEADER\n[1, 2]\n", 2, "a JSON list, not an object"),
    ("HEADER\n{\"id\": 0}\n{\"id\": 0}\n", 3, "with the id of an earlier one"),
    ("HEADER\n{\"x\": 0}\n{\"id\": 1}\n", 2, "a record without an id"),
    ("HEADER\n{\"id\": 0}\n", 2, "announces 2 items, the file holds 1"),
])
def test_a_damaged_scores_file_is_named_with_its_line(tmp_path, text, line, what):
    header = json.dumps({"scores": 1, "task": "sst", "experiment": "x", "cell": "lstm", "seed": 1,
                         "split": "test", "checkpoint": "best", "metrics": {}, "items": 2})
    path = tmp_path / "test.jsonl"
    path.write_text(text.replace("HEADER", header))
    with pytest.raises(DataError, match=rf"test.jsonl, line {line}: .*{_re(what)}"):
        read_scores(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(DataError, match="is not UTF-8 text"):
        read_scores(path)


def _re(text: str) -> str:
    import re

    return re.escape(text)


def test_non_finite_statistics_are_written_as_null(tmp_path):
    path = tmp_path / "s.jsonl"
    write_scores(path, {"task": "ptb", "experiment": "x", "cell": "lstm", "seed": 1,
                        "split": "test", "checkpoint": "best", "metrics": {"ppl": float("inf")}},
                 [{"id": 0, "nll": float("nan"), "tokens": 3}])
    back = read_scores(path)
    assert back.metrics == {"ppl": None} and back.records == [{"id": 0, "nll": None, "tokens": 3}]
    with pytest.raises(ValueError, match="two per-item records have the id 0"):
        write_scores(path, {"task": "ptb", "experiment": "x", "cell": "lstm", "seed": 1,
                            "split": "test", "checkpoint": "best", "metrics": {}},
                     [{"id": 0}, {"id": 0}])
