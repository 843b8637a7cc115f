"""The run folder's ``scores/<split>.jsonl.gz``: written by every training run's final
evaluation, gzip-compressed with the same bytes for the same content, rewritten from the
checkpoint by ``lstmablate eval RUN --scores`` (byte for byte, nothing else in the run changed;
an older run's uncompressed ``<split>.jsonl`` read alike and replaced), cleared with the run by
--force, protected from other outputs, and read back with one clear message for every kind of
damage, of the lines or of the gzip stream."""

from __future__ import annotations

import gzip
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
    assert sorted(p.name for p in (run.root / RunFiles.SCORES).iterdir()) == ["test.jsonl.gz"]
    data = run.scores("test").read_bytes()  # a gzip stream naming no file and no time
    assert data[:3] == b"\x1f\x8b\x08" and data[3] == 0 and data[4:8] == b"\0\0\0\0"
    lines = gzip.decompress(data).decode().splitlines()
    assert json.loads(lines[0])["items"] == len(lines) - 1 == 16
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
    assert after.pop(f"{RunFiles.SCORES}/test.jsonl.gz")
    assert after == before
    assert "wrote" in done.stderr and RunFiles.BEST in done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("wcpa_mean"))
    shown = line.split("\t")
    assert shown[1] == shown[2] == shown[3]  # from the scores == this evaluation == result.json
    js = run_cli("eval", run.root, "--scores", "--json", "--split", "dev", cwd=tmp_path)
    got = json.loads(js.stdout)
    assert got["path"].endswith("scores/dev.jsonl.gz") and got["from_scores"]["accuracy"] == \
        pytest.approx(got["metrics"]["accuracy"])


def test_an_older_runs_uncompressed_scores_are_read_and_eval_replaces_them(run, tmp_path):
    """A run written before scores were compressed has ``scores/test.jsonl``: every reader takes
    it as it took it then; ``eval --scores`` writes the ``.gz`` and the old file goes."""
    from lstmablate.run.record import Run

    old = tmp_path / "old"
    for p in run.root.rglob("*"):
        if p.is_file() and p.name != RunFiles.LOCK:
            (old / p.relative_to(run.root)).parent.mkdir(parents=True, exist_ok=True)
            (old / p.relative_to(run.root)).write_bytes(p.read_bytes())
    files = RunFiles(old)
    lines = gzip.decompress(files.scores("test").read_bytes())
    files.scores("test").unlink()
    files.scores_before("test").write_bytes(lines)
    assert files.scores_to_read("test") == files.scores_before("test")
    assert Run.open(old).scores("test").records == read_scores(run.scores("test")).records
    done = run_cli("eval", old, "--split", "test", "--scores", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not files.scores_before("test").exists()
    assert files.scores("test").read_bytes() == run.scores("test").read_bytes()


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
    files.scores_before("dev").write_text("")  # an older run's
    with pytest.raises(UserError, match="is a file of the run folder"):
        check_output([files.scores("test")], option="--write-predictions", force=True)
    clear_run_dir(files)
    assert not files.scores("test").exists() and not files.scores_before("dev").exists()


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
@pytest.mark.parametrize("name", ["test.jsonl.gz", "test.jsonl"])
def test_a_damaged_scores_file_is_named_with_its_line(tmp_path, text, line, what, name):
    header = json.dumps({"scores": 1, "task": "sst", "experiment": "x", "cell": "lstm", "seed": 1,
                         "split": "test", "checkpoint": "best", "metrics": {}, "items": 2})
    path = tmp_path / "scores" / name
    path.parent.mkdir()
    pack = (lambda b: gzip.compress(b, mtime=0)) if name.endswith(".gz") else (lambda b: b)
    path.write_bytes(pack(text.replace("HEADER", header).encode()))
    with pytest.raises(DataError, match=rf"{_re(name)}, line {line}: .*{_re(what)}") as e:
        read_scores(path)
    assert f"lstmablate eval {tmp_path} --split test --scores" in str(e.value)
    path.write_bytes(pack(b"\xff\xfe"))
    with pytest.raises(DataError, match="is not UTF-8 text"):
        read_scores(path)


def _stream(tmp_path: Path) -> bytes:
    path = tmp_path / "made.jsonl.gz"
    write_scores(path, {"task": "sst", "experiment": "x", "cell": "lstm", "seed": 1,
                        "split": "test", "checkpoint": "best", "metrics": {"accuracy": 50.0}},
                 [{"id": i, "correct": i % 2, "nll": 0.5 * i} for i in range(300)])
    return path.read_bytes()


@pytest.mark.parametrize("damage, what", [
    (lambda b: b[:len(b) // 2], "ends before its gzip stream does (the file was cut short)"),
    (lambda b: b[:-4] + bytes(4), "is not a gzip file or is damaged"),  # its length, wrong
    (lambda b: b[:-8] + bytes([b[-8] ^ 1]) + b[-7:], "is not a gzip file or is damaged"),  # CRC
    (lambda b: b"PK\x03\x04" + b, "is not a gzip file or is damaged"),
    (lambda b: b + b, "bytes after its gzip stream"),
    (lambda b: b"", "ends before its gzip stream does"),
])
def test_a_damaged_gzip_stream_is_one_message_naming_the_file(tmp_path, damage, what):
    path = tmp_path / "test.jsonl.gz"
    path.write_bytes(damage(_stream(tmp_path)))
    with pytest.raises(DataError, match=_re(what)) as e:
        read_scores(path)
    assert str(path) in str(e.value)


def test_a_small_gzip_file_never_grows_past_the_size_a_file_may_have(tmp_path):
    """A file of a few kilobytes may hold gigabytes of zeros: it is refused while it is read,
    at the same bound as an uncompressed file (``max_bytes``), never decompressed whole."""
    from lstmablate.io import read_text

    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(b"0" * 10**6, mtime=0))
    assert path.stat().st_size < 2000
    with pytest.raises(DataError, match="holds more than the 100,000 bytes"):
        read_text(path, max_bytes=100_000)
    assert len(read_text(path, max_bytes=10**6)) == 10**6


def test_the_same_scores_give_the_same_bytes(tmp_path):
    """No time and no file name in the stream: a record's bytes follow its content, so a run
    scored again, or its scores copied elsewhere, compare equal byte for byte."""
    first = _stream(tmp_path)
    (tmp_path / "made.jsonl.gz").unlink()
    again = _stream(tmp_path)
    assert first == again
    flags, mtime = first[3], first[4:8]
    assert flags & 0x08 == 0 and mtime == bytes(4)  # FNAME unset, MTIME 0


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
