"""The run folder protects itself.

* ``eval --write-predictions``, ``plot --out`` and ``visualize --out`` never write over a run's
  own files (config, checkpoints, metrics, result, lock, artefacts, TensorBoard events), nor
  into its folder (tests/test_run_folder_boundary.py: every command's outputs);
* the artefacts are written with a manifest of their sizes and sha256, checked whenever they
  are read: a deleted, changed or mis-encoded artefact is one message naming it, never a
  traceback and never another file blamed; a run saved before manifests existed is checked by
  what the task can use;
* the temporary files of writes a kill -9 interrupted are deleted when the run starts again,
  and every rewrite (``metrics.jsonl`` on resume included) is atomic;
* a command that writes several files checks all of them before writing the first;
* ``plot`` over a folder names and skips a damaged run, as ``report`` does.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from lstmablate.errors import UserError
from lstmablate.run.runner import evaluate_run, train_run
from lstmablate.run.runs import RunFiles

from cli_in_process import expect_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = Console(file=io.StringIO())
PTB_RECIPE = ("task: ptb\nexperiment: tinyptb\ndata: {batch_size: 2, num_steps: 3, verify: false}\n"
              "model: {hidden_size: 8}\n")


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def dyck_run(tmp_path, tiny_recipe):
    return train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET,
                     progress=False, overrides=["train.max_steps=2"], threads=1).run_dir


@pytest.fixture
def ptb_run(tmp_path):
    recipe = tmp_path / "tinyptb.yaml"
    recipe.write_text(PTB_RECIPE)
    return train_run("ptb", "lstm", recipe=str(recipe), out=tmp_path / "runs", console=QUIET,
                     progress=False, overrides=["train.max_steps=2"], threads=1,
                     data_dir=str(FIXTURES)).run_dir


# ------------------------------------------------------------------ outputs never over run files

def test_eval_never_writes_predictions_over_the_runs_own_files(tmp_path, dyck_run):
    before = snapshot(dyck_run)
    r = run_cli("eval", str(dyck_run), "--write-predictions", str(RunFiles(dyck_run).last),
                cwd=tmp_path)
    expect_error(r, RunFiles.LAST, "is a file of the run folder", "Nothing was written")
    files = RunFiles(dyck_run)
    for target in (files.best, files.config, files.metrics, files.result, files.env,
                   dyck_run / RunFiles.LOCK, files.manifest, files.artefacts / "new.json",
                   files.tensorboard / "events.x", dyck_run / ".." / "seed-1" / RunFiles.LAST):
        with pytest.raises(UserError, match="is a file of the run folder"):
            evaluate_run(dyck_run, write_predictions=target)
    # nor a new file among them: the run folder is the run's
    with pytest.raises(UserError, match="is inside the run folder"):
        evaluate_run(dyck_run, write_predictions=dyck_run / "preds.jsonl")
    assert snapshot(dyck_run) == before
    # beside the run folder is fine
    ok = tmp_path / "preds.jsonl"
    assert evaluate_run(dyck_run, write_predictions=ok)["accuracy"] >= 0
    assert ok.exists()


def test_plot_and_visualize_outputs_never_go_into_a_runs_own_folders(tmp_path, dyck_run):
    before = snapshot(dyck_run)
    expect_error(run_cli("visualize", str(dyck_run), "--text", "(a a)", "--out",
                         str(RunFiles(dyck_run).artefacts / "w.png"), cwd=tmp_path),
                 "is a file of the run folder")
    expect_error(run_cli("plot", str(dyck_run), "--out",
                         str(RunFiles(dyck_run).tensorboard / "c.png"), cwd=tmp_path),
                 "is a file of the run folder")
    assert snapshot(dyck_run) == before


def test_visualize_checks_its_output_before_loading_anything(tmp_path, dyck_run):
    (tmp_path / "adir.png").mkdir()
    for out, fragment in (("x.txt", "ending in .png"), ("adir.png", "it is a directory"),
                          ("adir", "ending in .png")):
        expect_error(run_cli("visualize", str(dyck_run), "--text", "(a a)", "--out", out,
                             cwd=tmp_path), fragment)
    r = run_cli("visualize", str(dyck_run), "--text", "(a (b b) a)", "--out", "w.png", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "w.png").exists() and (tmp_path / "w.csv").exists()


# ------------------------------------------------------------------ artefacts and their manifest

def test_artefacts_are_written_with_a_manifest_of_sizes_and_hashes(ptb_run):
    import hashlib

    manifest = json.loads(RunFiles(ptb_run).manifest.read_text())
    assert set(manifest["files"]) == {"vocab.json"}
    data = (RunFiles(ptb_run).artefacts / "vocab.json").read_bytes()
    assert manifest["files"]["vocab.json"] == {"bytes": len(data),
                                               "sha256": hashlib.sha256(data).hexdigest()}


DAMAGE = {
    "deleted": lambda p: p.unlink(),
    "not UTF-8": lambda p: p.write_bytes(p.read_bytes()[:-20] + b"\xff\xfe\"]\n"),
    "one word short": lambda p: p.write_text(json.dumps(json.loads(p.read_text())[:-1])),
    "a mapping": lambda p: p.write_text(json.dumps({"a": 1})),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_artefact_is_named_by_eval_and_resume(tmp_path, ptb_run, damage):
    vocab = RunFiles(ptb_run).artefacts / "vocab.json"
    DAMAGE[damage](vocab)
    r = run_cli("eval", str(ptb_run), "--data-dir", str(FIXTURES), cwd=tmp_path)
    text = expect_error(r, "artefacts are damaged", "vocab.json")
    assert "ptb.test.txt" not in text  # the data file is not blamed
    RunFiles(ptb_run).result.unlink()
    recipe = tmp_path / "tinyptb.yaml"
    r = run_cli("train", "--task", "ptb", "--recipe", str(recipe), "--out", "runs", "--data-dir",
                str(FIXTURES), "--set", "train.max_steps=2", "--threads", "1", "--resume",
                cwd=tmp_path)
    expect_error(r, "artefacts are damaged", "vocab.json", "--force")


@pytest.mark.parametrize("damage, fragment", [("not UTF-8", "is not UTF-8 text"),
                                               ("one word short", "does not fit the model"),
                                               ("a mapping", "artefacts/vocab.json is not a list")])
def test_a_run_saved_before_manifests_is_checked_by_what_the_task_can_use(tmp_path, ptb_run,
                                                                          damage, fragment):
    RunFiles(ptb_run).manifest.unlink()
    assert evaluate_run(ptb_run, data_dir=str(FIXTURES))["ppl"] > 1  # still evaluates
    DAMAGE[damage](RunFiles(ptb_run).artefacts / "vocab.json")
    r = run_cli("eval", str(ptb_run), "--data-dir", str(FIXTURES), cwd=tmp_path)
    expect_error(r, fragment)


# ------------------------------------------------------------------ interrupted writes

KILL_MID_WRITE = """
import os, signal, sys
from lstmablate.io import atomic_write

def write(f):  # half of the new content, then kill -9
    f.write(b"x" * 100000)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

atomic_write(sys.argv[1], write)
"""


def test_temporary_files_of_killed_writes_are_removed_when_the_run_starts_again(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=3", "--threads", "1"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    RunFiles(run).result.unlink()
    before = snapshot(run)
    files = RunFiles(run)
    for target in (files.last, files.last, files.best, files.metrics, files.manifest):
        p = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(target)],
                           capture_output=True)
        assert p.returncode == -9
    leftovers = sorted(p.name for p in run.rglob(".tmp-*"))
    assert len(leftovers) == 5, leftovers  # what kill -9 leaves: the old files are intact
    assert {k: v for k, v in snapshot(run).items() if ".tmp-" not in k} == before
    r = run_cli(*args, "--resume", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list(run.rglob(".tmp-*"))
    assert RunFiles(run).result.exists()


def test_the_metrics_rewrite_of_a_resume_is_atomic(tmp_path, tiny_recipe, monkeypatch):
    """Resuming truncates metrics.jsonl to the checkpoint's lines; a failure in the middle of
    that rewrite (here: the disk fills up) leaves the file as it was, never half of it."""
    from lstmablate.io import write as atomic

    args = dict(recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET, progress=False,
                threads=1, overrides=["train.max_steps=2", "train.eval_every=1"])
    run = train_run("dyck", "lstm", **args).run_dir
    RunFiles(run).result.unlink()
    metrics = RunFiles(run).metrics
    with open(metrics, "a") as f:
        f.write('{"step": 3, "written after": "the last checkpoint"}\n')
    before = metrics.read_bytes()

    def full_disk():
        raise OSError(errno.ENOSPC, "No space left on device")

    real_write_text, real_fsync = Path.write_text, os.fsync

    def half_write_text(self, data, *a, **k):  # a plain rewrite dies half-way
        if self.name == RunFiles.METRICS:
            real_write_text(self, data[: len(data) // 2], *a, **k)
            full_disk()
        return real_write_text(self, data, *a, **k)

    def fsync(fd):  # an atomic rewrite of metrics.jsonl finds the disk full before its rename
        if ".tmp-metrics.jsonl" in os.readlink(f"/proc/self/fd/{fd}"):
            full_disk()
        return real_fsync(fd)

    if not Path("/proc/self/fd").exists():
        pytest.skip("needs /proc to name the file being written")
    monkeypatch.setattr(Path, "write_text", half_write_text)
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises((UserError, OSError)):
        train_run("dyck", "lstm", resume=True, **args)
    assert metrics.read_bytes() == before
    monkeypatch.undo()
    resumed = train_run("dyck", "lstm", resume=True, **args)
    assert resumed.result.steps == 2
    assert len(metrics.read_text().splitlines()) == 2


# ------------------------------------------------------------------ several outputs, checked first

def test_nmt_predictions_check_all_three_files_before_writing_any(tmp_path):
    sets = ["data.verify=false", "model.word_vec_size=8", "model.hidden_size=8", "model.layers=1",
            "train.max_steps=1", "train.eval_test=false", "eval.beam_size=1", "eval.max_length=5"]
    data = str(FIXTURES / "nmt")
    out = train_run("nmt", "lstm", overrides=sets, out=tmp_path / "runs", console=QUIET,
                    progress=False, data_dir=data, threads=1)
    pred = tmp_path / "n.de"
    (tmp_path / "n.de.bleu").mkdir()
    with pytest.raises(UserError, match="n.de.bleu: it is a directory.*Nothing was written"):
        evaluate_run(out.run_dir, data_dir=data, write_predictions=pred)
    assert not pred.exists() and not (tmp_path / "n.de.atok").exists()
    (tmp_path / "n.de.bleu").rmdir()
    metrics = evaluate_run(out.run_dir, data_dir=data, write_predictions=pred)
    assert pred.exists() and (tmp_path / "n.de.atok").exists() and (tmp_path / "n.de.bleu").exists()
    assert set(metrics) >= {"bleu", "sacrebleu"}


# ------------------------------------------------------------------ plot skips damaged runs

def test_plot_names_and_skips_a_damaged_run_as_report_does(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=2", "--set", "train.eval_every=1", "--threads", "1"]
    for seed in ("1", "2"):
        assert run_cli(*args, "--seed", seed, cwd=tmp_path).returncode == 0
    assert run_cli(*args, "--cell", "lstm-srnn", cwd=tmp_path).returncode == 0
    tiny = tmp_path / "runs" / "tiny"
    with open(RunFiles(tiny / "lstm" / "seed-2").metrics, "a") as f:
        f.write('{"step": 3, "accur')  # a line cut by kill -9
    RunFiles(tiny / "lstm-srnn" / "seed-1").config.write_text("task: [dyck\n")
    r = run_cli("plot", "runs", "--out", "curves.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert "skipped" in err and "seed-2/metrics.jsonl, line 3" in err
    assert "YAML syntax error in runs/tiny/lstm-srnn/seed-1/config.yaml, line 2" in err
    rows = (tmp_path / "curves.csv").read_text().splitlines()[1:]
    assert rows and {r.split(",")[1] for r in rows} == {"lstm"}
    assert {r.split(",")[2] for r in rows} == {"1", "mean"}  # seed 2 left out
    # one damaged run given alone is still an error
    expect_error(run_cli("plot", str(tiny / "lstm" / "seed-2"), "--out", "c.png", cwd=tmp_path),
                 "metrics.jsonl, line 3")
