"""The catalogue of bad inputs: each exits with code 2 and one message naming the
file (and line) and what was expected; no traceback; nothing already written is lost."""

from __future__ import annotations

import gzip
import shutil

import pytest

from cli_in_process import expect_error, run_cli

from lstmablate.run.runs import RunFiles

DYCK_FILES = ["--task", "dyck", "--data-dir", "data", "--set", "data.files=dy", "--set", "data.m=4",
              "--set", "data.train_tokens=0", "--set", "train.max_steps=2", "--threads", "1"]


@pytest.fixture
def dyck_data(tmp_path):
    r = run_cli("data", "dyck", "--out", "data/dy", "--m", "4", "--train-sequences", "40",
                "--dev-sequences", "8", "--test-sequences", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "data" / "dy"


def test_missing_data_file_names_path_and_fetch_command(tmp_path):
    r = run_cli("train", "--task", "ptb", "--recipe", "ptb-small", "--data-dir", "nowhere", cwd=tmp_path)
    expect_error(r, "ptb.train.txt", "nowhere", "lstmablate data fetch ptb")


def test_wrong_checksum(tmp_path, real_data_dir):
    d = tmp_path / "data" / "ptb"
    d.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        shutil.copy(real_data_dir / "ptb" / f"ptb.{split}.txt.gz", d)
    text = gzip.decompress((d / "ptb.valid.txt.gz").read_bytes()).replace(b" the ", b" a ", 1)
    (d / "ptb.valid.txt.gz").write_bytes(gzip.compress(text))
    r = run_cli("data", "check", "ptb", "--data-dir", "data", cwd=tmp_path)
    expect_error(r, "ptb.valid.txt", "sha256")


def test_truncated_gz(tmp_path, dyck_data):
    raw = gzip.compress((dyck_data / "train.txt").read_bytes())
    (dyck_data / "train.txt").unlink()
    (dyck_data / "train.txt.gz").write_bytes(raw[: len(raw) // 2])
    expect_error(run_cli("train", *DYCK_FILES, cwd=tmp_path), "train.txt.gz", "truncated")


def test_non_utf8(tmp_path, dyck_data):
    with open(dyck_data / "dev.txt", "ab") as f:
        f.write(b"(a \xff a) END\n")
    expect_error(run_cli("train", *DYCK_FILES, cwd=tmp_path), "dev.txt, line 9", "UTF-8")


def test_empty_file(tmp_path, dyck_data):
    (dyck_data / "test.txt").write_text("")
    expect_error(run_cli("train", *DYCK_FILES, cwd=tmp_path), "test.txt", "empty")


def test_malformed_line(tmp_path, dyck_data):
    with open(dyck_data / "train.txt", "a") as f:
        f.write("(a (b a) b) END\n")
    expect_error(run_cli("train", *DYCK_FILES, cwd=tmp_path), "train.txt, line 41", "does not match")


def test_malformed_json_result(tmp_path, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe), "--set", "train.max_steps=2",
                "--out", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = RunFiles(tmp_path / "runs" / "tiny" / "lstm" / "seed-1").result
    result.write_text('{"test": {"accuracy": 1.0,\n  oops}\n')
    r = run_cli("report", "runs", cwd=tmp_path)
    # one damaged result.json is named and skipped; it does not abort the report (issue 18)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    err = " ".join(r.stderr.split())
    assert "warning: skipped" in err and "result.json, line 2: malformed JSON" in err
    assert "## Skipped run folders" in r.stdout and "| `lstm` | missing" in r.stdout


def test_report_out_is_a_directory(tmp_path, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe), "--set", "train.max_steps=2",
                "--out", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "tables").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    expect_error(run_cli("report", "runs", "--out", "tables", cwd=tmp_path),
                 "cannot write tables: it is a directory")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no stray temporary file


def test_yaml_syntax_error_and_unknown_key(tmp_path):
    (tmp_path / "bad.yaml").write_text("task: dyck\ntrain:\n  lr: [0.1,\n")
    expect_error(run_cli("train", "--task", "dyck", "--recipe", "bad.yaml", cwd=tmp_path),
                 "bad.yaml, line 4", "YAML syntax error")
    (tmp_path / "typo.yaml").write_text("task: dyck\ntrain:\n  learning_rate: 0.1\n")
    expect_error(run_cli("train", "--task", "dyck", "--recipe", "typo.yaml", cwd=tmp_path),
                 "train.learning_rate", "typo.yaml")


def test_output_dir_with_a_different_run_is_refused(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs"]
    assert run_cli(*args, "--set", "train.max_steps=2", cwd=tmp_path).returncode == 0
    d = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    expect_error(run_cli(*args, "--set", "train.max_steps=3", cwd=tmp_path),
                 "already holds a different run", "--force")
    expect_error(run_cli(*args, "--set", "train.max_steps=2", cwd=tmp_path),
                 "already holds this run", "--resume")
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before  # nothing overwritten
    assert run_cli(*args, "--set", "train.max_steps=3", "--force", cwd=tmp_path).returncode == 0


def test_checkpoint_from_another_cell(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=2"]
    assert run_cli(*args, "--cell", "lstm", cwd=tmp_path).returncode == 0
    assert run_cli(*args, "--cell", "gru", cwd=tmp_path).returncode == 0
    runs = tmp_path / "runs" / "tiny"
    shutil.copy(RunFiles(runs / "lstm" / "seed-1").last, RunFiles(runs / "gru" / "seed-1").last)
    expect_error(run_cli(*args, "--cell", "gru", "--resume", cwd=tmp_path), RunFiles.LAST,
                 "cell='lstm'")
    RunFiles(runs / "lstm" / "seed-1").best.write_bytes(b"not a checkpoint")
    expect_error(run_cli("eval", "runs/tiny/lstm/seed-1", cwd=tmp_path), RunFiles.BEST, "corrupt")


def test_malformed_conllu_line(tmp_path):
    (tmp_path / "x.conllu").write_text("1\tI\tI\tPRON\tPRP\t_\t0\troot\t_\t_\n2\tam\tbe\tAUX\n\n")
    expect_error(run_cli("data", "validate-conllu", "x.conllu", cwd=tmp_path),
                 "x.conllu, line 2", "4 tab-separated fields instead of 10")
