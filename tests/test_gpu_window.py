"""``make gpu-window`` (``lstmablate.bench.window``) on the CPU, so that nothing in it is first
run on a GPU: the plan (which runs fit the minutes left, sharing the GPU, shortened where
allowed, never at the cost of a run planned before), the state of a run read from its folder,
log and process, the archive of the small records (never a checkpoint), the install from
carried wheels, the data ``prepare`` copies, and the whole window end to end with the tiny
Dyck recipe and the CPU as its device: prepare, install, gpu-check's stages (the CUDA-only
ones "skipped: no CUDA"), the runs started detached, watched by the first command and the
second, collected into the archive."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest

from lstmablate.bench import window, window_archive, window_carry, window_files, window_plan, \
    window_runs
from lstmablate.run.runs import RunFiles

from conftest import TINY_DYCK, write_record_text

ROOT = Path(__file__).resolve().parents[1]

NMT_CELLS = ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden", "lstm-gates"]


def _step(recipe, task, cell, ms, gpu_ms, steps_per_epoch, epochs):
    return dict(kind="step", recipe=recipe, task=task, cell=cell, ms=ms, gpu_ms=gpu_ms,
                steps_per_epoch=steps_per_epoch, epochs=epochs,
                run_steps=steps_per_epoch * epochs, setup_s=0.0, eval_s=0.0)


#: NMT: 450 steps x 13 epochs of 40 ms, the GPU busy 8 ms of each (a share of 0.2);
#: PTB-medium: 1327 x 39 steps of 4 ms (6 ms for lstm-gates), a share of 0.1
ROWS = ([_step("nmt-multi30k", "nmt", c, 40.0, 8.0, 450, 13) for c in NMT_CELLS]
        + [_step("ptb-medium", "ptb", c, 6.0 if c == "lstm-gates" else 4.0,
                 0.6 if c == "lstm-gates" else 0.4, 1327, 39) for c in NMT_CELLS])
#: the default plan with no start-up or final evaluation: an estimate is then SAFETY x steps x
#: seconds per step x the slowdown (the sum of the GPU shares of every run, at least 1)
PLAN = [[dict(g, start_s=0, final_s=0) for g in slot] for slot in window_plan.DEFAULT_PLAN]


def _plan(seconds, rows=ROWS, plan=PLAN):
    runs, skipped = window_plan.plan_runs(plan, [dict(r) for r in rows], seconds)
    return {r.key: r for r in runs}, {s["group"]: s["reason"] for s in skipped}


def test_table4_and_the_gates_learning_rates_when_both_fit():
    # 5 NMT runs (share 1.0) + 3 gates runs (0.3): every step 1.3x as long as alone
    runs, skipped = _plan(480.0)
    assert skipped == {}
    assert sorted(runs) == sorted([f"nmt-multi30k/{c}/seed-1" for c in NMT_CELLS] + [
        f"ptb-medium-lstm-gates-lr{lr}/lstm-gates/seed-1" for lr in ("0.1", "0.2", "0.3")])
    nmt = runs["nmt-multi30k/lstm/seed-1"]
    assert (nmt.epochs, nmt.shortened, nmt.sets) == (13, False, [])
    assert nmt.estimate_s == pytest.approx(1.15 * 5850 * 0.040 * 1.3, abs=0.1)  # 349.8
    gates = runs["ptb-medium-lstm-gates-lr0.2/lstm-gates/seed-1"]
    assert gates.sets == ["train.lr=0.2"] and not gates.shortened
    assert gates.estimate_s == pytest.approx(1.15 * 51753 * 0.006 * 1.3, abs=0.1)  # 464.2


def test_else_table1_medium_for_the_epochs_that_fit():
    # the gates runs need 464.2 s of the 420; Table 1 medium's five cells (share 0.5): every
    # step 1.5x, Table 4 then takes 403.6 s (fits); lstm-gates, 1.15 x 1327 x 0.006 x 1.5 =
    # 13.73 s an epoch, fits 30 of its 39 epochs
    runs, skipped = _plan(420.0)
    assert skipped == {"gates-lr": "lstm-gates needs about 7.7 min (with 8 runs sharing the "
                                   "GPU), 7.0 min are left"}
    assert runs["nmt-multi30k/lstm-srnn/seed-1"].estimate_s == pytest.approx(403.65, abs=0.1)
    lstm = runs["ptb-medium/lstm/seed-1"]
    assert (lstm.epochs, lstm.shortened, lstm.sets) == (39, False, [])
    gates = runs["ptb-medium/lstm-gates/seed-1"]
    assert (gates.epochs, gates.shortened) == (30, True)
    assert gates.sets == [f"train.max_steps={30 * 1327}"]
    assert gates.estimate_s <= 420.0 < window_plan.estimate(gates, ROWS[-1], 1.5, 31)


def test_nothing_is_added_that_would_make_table4_miss_the_end():
    # Table 4 alone: 269.1 s of 300; with the gates runs (1.3x) it would need 349.8 s
    runs, skipped = _plan(300.0)
    assert sorted(runs) == sorted(f"nmt-multi30k/{c}/seed-1" for c in NMT_CELLS)
    assert runs["nmt-multi30k/lstm/seed-1"].estimate_s == pytest.approx(269.1, abs=0.1)
    assert skipped == dict.fromkeys(("gates-lr", "table1-medium"), (
        "beside the runs already planned, they would no longer finish in 5.0 min"))


def test_table4_shortened_when_its_13_epochs_do_not_fit():
    # 1.15 x 450 x 0.040 = 20.7 s an epoch: 9 epochs in 200 s
    runs, _ = _plan(200.0)
    assert {(r.epochs, r.shortened, tuple(r.sets)) for r in runs.values()} == {
        (9, True, (f"train.max_steps={9 * 450}",))}


def test_a_cell_not_timed_is_planned_at_the_slowest_step_timed():
    rows = [r for r in ROWS if (r["recipe"], r["cell"]) != ("nmt-multi30k", "lstm-srnn-out")]
    runs, _ = _plan(480.0, rows)
    run = runs["nmt-multi30k/lstm-srnn-out/seed-1"]
    assert run.timed_as == "lstm" and runs["nmt-multi30k/lstm/seed-1"].timed_as is None
    runs, skipped = _plan(480.0, [])
    assert runs == {} and skipped["table4"] == (
        "no training step of nmt-multi30k was measured (gpu-check's steps stage)")


def test_the_shipped_plan_puts_the_gates_learning_rates_first():
    # benchmarks/plans/gates-lr-first.json: three whole lstm-gates runs (shares 3 x 0.1: no
    # slowdown), 1.15 x 51753 x 0.006 = 357.1 s each; then Table 1 medium beside them
    plan = window_plan.load_plan(str(ROOT / "benchmarks" / "plans" / "gates-lr-first.json"))
    plan = [[dict(g, start_s=0, final_s=0) for g in slot] for slot in plan]
    runs, skipped = _plan(400.0, plan=plan)
    gates = [f"ptb-medium-lstm-gates-lr{lr}/lstm-gates/seed-1" for lr in ("0.1", "0.2", "0.3")]
    assert skipped == {} and set(gates) < set(runs)
    assert [runs[k].estimate_s for k in gates] == [pytest.approx(357.1, abs=0.1)] * 3
    assert [runs[k].sets for k in gates] == [["train.lr=0.1"], ["train.lr=0.2"], ["train.lr=0.3"]]
    assert not any(r.shortened for r in runs.values())
    # 300 s: no gates run fits whole (they are never shortened); Table 1 medium, shortened
    runs, skipped = _plan(300.0, plan=plan)
    assert list(skipped) == ["gates-lr"] and not set(gates) & set(runs)
    assert runs["ptb-medium/lstm-gates/seed-1"].shortened


@pytest.mark.parametrize("text,expected", [
    ('[[{"name": "x", "recipe": "ptb-medium"}]', "line 1, column 41"),
    ('{"name": "x"}', "a plan is a JSON list of slots"),
    (b"\xff\xfe", "not UTF-8 text")])
def test_a_bad_plan_file_is_named_with_where_it_is_wrong(tmp_path, text, expected):
    path = tmp_path / "plan.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(window_files.WindowError, match=expected) as err:
        window_plan.load_plan(str(path))
    assert str(path) in str(err.value)
    with pytest.raises(window_files.WindowError, match="cannot be read"):
        window_plan.load_plan(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("group,expected", [
    ('"x"', "slot 1, group 2: the group is a JSON object, not str"),
    ('{"name": "b", "recipe": "r", "lr": [1]}',
     "slot 1, group 2: unknown field 'lr' in group 'b', which has name, recipe, cells, lrs"),
    ('{"name": "b"}', "slot 1, group 2: group 'b' has no 'recipe'"),
    ('{"recipe": "r"}', "slot 1, group 2: the group has no 'name'"),
    ('{"name": "b", "recipe": "r", "lrs": [0.5, 0.5]}',
     "slot 1, group 2: group 'b''s 'lrs' must be a non-empty list of distinct positive "
     "learning rates, got \\[0.5, 0.5\\]"),
    ('{"name": "a", "recipe": "r"}', "slot 1, group 2: a second group named 'a'")])
def test_a_bad_plan_group_is_named_with_its_slot_group_and_field(tmp_path, group, expected):
    path = tmp_path / "plan.json"
    path.write_text(f'[[{{"name": "a", "recipe": "ptb-medium"}}, {group}]]')
    with pytest.raises(window_files.WindowError, match=expected) as err:
        window_plan.load_plan(str(path))
    assert str(err.value).startswith(f"{path}: slot 1, group 2: ")
    assert "\n" not in str(err.value)


def _run_files(base: Path, experiment="exp", cell="lstm") -> RunFiles:
    return RunFiles.of(window_files.work_dir(base) / "runs", experiment, cell, 1)


def _run(pid, experiment="exp", cell="lstm") -> window_files.Run:
    return window_files.Run(group="g", recipe="r", recipe_name="r", task="dyck", cell=cell, seed=1,
                      experiment=experiment, sets=[], epochs=3, full_epochs=3, steps_per_epoch=4,
                      estimate_s=10.0, pid=pid, state="running")


def test_runs_start_with_the_windows_paths_relative_to_the_checkout(tmp_path, monkeypatch):
    """The runs' command line (what each run's env.json records, and what comes back) names the
    window's runs and data folders relative to the folder the window runs in, never by the GPU
    machine's own paths; a folder outside it stays as it is."""
    from lstmablate.bench import window_runs

    started = []

    class Process:
        pid = 4242

    monkeypatch.setattr(window_runs.subprocess, "Popen",
                        lambda cmd, **kw: started.append((cmd, kw)) or Process())
    monkeypatch.setattr(window_runs, "_CHILDREN", {})
    checkout = tmp_path / "checkout"
    (checkout / ".gpuwindow" / "data").mkdir(parents=True)
    monkeypatch.chdir(checkout)
    run = _run(None)
    window_runs.start_runs([run], checkout / ".gpuwindow", "cpu", {})
    cmd, kw = started[0]
    option = dict(zip(cmd, cmd[1:]))
    assert option["--out"] == ".gpuwindow/local/runs" and option["--data-dir"] == ".gpuwindow/data"
    assert kw["cwd"] == checkout and run.state == "running" and run.command == cmd
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    window_runs.start_runs([_run(None)], elsewhere, "cpu", {})
    option = dict(zip(started[1][0], started[1][0][1:]))
    assert option["--out"] == str(elsewhere / "local" / "runs")


def test_a_run_read_from_its_folder_log_and_process_then_collected(tmp_path):
    """A run still training (another command started it: only its pid is known), one that
    stopped without a result and one that finished: each one's state, progress and last
    evaluation; the archive holds their small records and the end of their logs, never a
    checkpoint, and the summary says how far each got."""
    base = tmp_path / "gpuwindow"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                "lstmablate"], start_new_session=True)
    cmdline = Path(f"/proc/{sleeper.pid}/cmdline")
    for _ in range(500):  # (just after the start the kernel may still show the parent's)
        if b"lstmablate" in cmdline.read_bytes():
            break
        time.sleep(0.01)
    try:
        runs = [_run(sleeper.pid, cell="lstm"), _run(2**22 + 1, cell="lstm-srnn"),
                _run(None, cell="lstm-gates")]
        for run in runs:
            files = _run_files(base, cell=run.cell)
            files.root.mkdir(parents=True)
            files.config.write_text("task: dyck\n")
            files.metrics.write_text(json.dumps(dict(step=4, epoch=1, accuracy=50.0)) + "\n")
            files.last.write_bytes(b"checkpoint")
            files.log.write_text("eval step 4 epoch 1\nepoch 2 batch 3/4 step 7: train loss "
                                 "1.2500  1,234 tokens/s  lr 0.02  epoch ETA 1s\n")
        gates = _run_files(base, cell="lstm-gates")
        gates.result.write_text(json.dumps(dict(steps=12, test={"accuracy": 75.0},
                                                shortened=False, train_time_s=3.0)))
        (gates.root / RunFiles.SCORES).mkdir()
        write_record_text(gates.scores("test"), "{}\n")
        for run in runs:
            window_runs.update(run, base)
        assert [r.state for r in runs] == ["running", "stopped", "finished"]
        assert runs[0].progress["step"] == 7 and runs[0].progress["tokens_per_s"] == 1234
        assert runs[0].progress["last_eval"]["accuracy"] == 50.0
        assert runs[1].progress["log_end"][-1].startswith("epoch 2 batch 3/4")
        assert runs[2].progress["test"] == {"accuracy": 75.0}
        assert runs[2].progress["step"] == 12  # the result's steps, not the log's last line (7)
        state = dict(gpu="cpu", calls=[dict(mode="run", started="now", minutes=3)],
                     runs=[asdict(r) for r in runs], not_started=[
                         dict(group="later", reason="no time")])
        archive = window_archive.collect(state, base, tmp_path / "out")
        with tarfile.open(archive) as tar:
            names = set(tar.getnames())
            saved = json.loads(tar.extractfile(window_files.STATE).read())
        base_name = "runs/exp/{}/seed-1"
        for cell in ("lstm", "lstm-srnn", "lstm-gates"):
            assert {f"{base_name.format(cell)}/{RunFiles.CONFIG}",
                    f"{base_name.format(cell)}/{RunFiles.METRICS}",
                    f"{base_name.format(cell)}.log"} <= names
        assert f"{base_name.format('lstm-gates')}/{RunFiles.RESULT}" in names
        assert f"{base_name.format('lstm-gates')}/scores/test.jsonl.gz" in names
        assert not [n for n in names if n.endswith(".pt")]
        assert [r["state"] for r in saved["runs"]] == ["running", "stopped", "finished"]
        text = (tmp_path / "out" / window_archive.SUMMARY).read_text()
        assert "| exp/lstm/seed-1 | 3 epochs | 0.2 min | running | step 7 (epoch 2, 1,234 " \
               "tokens/s) | epoch 1: accuracy 50 |  |" in text
        assert "accuracy 75" in text and "not started: later: no time" in text
    finally:
        sleeper.kill()
        sleeper.wait()
    window_runs.update(runs[0], base)
    assert runs[0].state == "stopped"


def _wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: one module ``name`` with ``VALUE = 42``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": "VALUE = 42\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_install_takes_the_missing_wheels_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    base = tmp_path / "gpuwindow"
    probe = _wheel(base / "wheels", "gpuwindow_probe")
    _wheel(base / "wheels", "pytest", "0.0.1")  # installed here already: left alone
    env = {"PATH": "/usr/bin:/bin"}
    report = window_carry.install(base, env)
    site = window_files.work_dir(base) / "site"
    assert report["installed"] == [probe.name] and report["missing"] == []
    assert env["PYTHONPATH"] == str(site) and str(site) in sys.path
    assert (site / "gpuwindow_probe.py").is_file() and not (site / "pytest").exists()
    r = subprocess.run([sys.executable, "-c", "import gpuwindow_probe; print(gpuwindow_probe.VALUE)"],
                       env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "42", r.stderr
    assert window_carry.install(base, dict(env))["installed"] == []  # the second command: nothing


def test_prepare_copies_the_data_the_plan_reads(tmp_path, real_data_dir):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[dict(name="small", recipe="ptb-small")]]))
    base = tmp_path / "gpuwindow"
    assert window.main(["prepare", "--wheels", "", "--folder", str(base), "--plan", str(plan),
                        "--data-dir", str(real_data_dir)]) == 0
    copied = sorted(p.relative_to(base / "data").as_posix() for p in (base / "data").rglob("*")
                    if p.is_file())
    assert [c.removesuffix(".gz") for c in copied] == [
        "ptb/ptb.test.txt", "ptb/ptb.train.txt", "ptb/ptb.valid.txt"]
    assert (base / "wheels").is_dir() and not list((base / "wheels").iterdir())


def test_what_travels_is_what_git_lists_and_the_carried_folders(tmp_path):
    """The device tool carries the checkout's tracked files, its untracked ones git does not
    ignore and the carried folders: so many bytes, counted before a call is made; over the
    tool's limit, prepare says so, naming the largest folders."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_bytes(b"x" * 1000)  # tracked
    (repo / "pkg" / "gone.py").write_bytes(b"x" * 50)  # tracked, then deleted: not there
    (repo / "notes.md").write_bytes(b"y" * 300)  # untracked, not ignored: travels
    (repo / ".gitignore").write_text("/.gpuwindow/\n/big/\n")
    (repo / "big").mkdir()
    (repo / "big" / "blob").write_bytes(b"z" * 10**6)  # ignored: stays
    (repo / ".gpuwindow" / "wheels").mkdir(parents=True)
    (repo / ".gpuwindow" / "wheels" / "w.whl").write_bytes(b"w" * 2000)  # ignored, carried
    assert subprocess.run(["git", "init", "-q", str(repo)]).returncode == 0
    assert subprocess.run(["git", "-C", str(repo), "add", "pkg", ".gitignore"]).returncode == 0
    (repo / "pkg" / "gone.py").unlink()
    sizes = window_carry.travelling_files(repo, [repo / ".gpuwindow" / "wheels"])
    assert sizes == {"pkg/a.py": 1000, "notes.md": 300, ".gitignore": 19,
                     ".gpuwindow/wheels/w.whl": 2000}
    line = window_carry.check_travel(repo, [repo / ".gpuwindow" / "wheels"], limit=4000)
    assert line.startswith("0.0 MiB travel to the GPU machine in all")
    with pytest.raises(window_files.WindowError) as e:
        window_carry.check_travel(repo, [repo / ".gpuwindow" / "wheels"], limit=3000)
    text = str(e.value)
    assert "more than the 0 MiB its tool carries: the call would be refused" in text
    assert text.index(".gpuwindow/wheels 0.0 MiB") < text.index("pkg/a.py 0.0 MiB")  # largest first
    assert window_carry.travelling_files(tmp_path / "elsewhere", []) is None  # not a checkout
    assert "is not a git checkout here" in window_carry.check_travel(tmp_path / "elsewhere", [])


def test_a_watch_without_a_window_says_what_happened(tmp_path, capsys):
    assert window.main(["watch", "--minutes", "1", "--out", str(tmp_path / "out"),
                        "--folder", str(tmp_path / "gpuwindow")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-window: error: no window on this machine") and err.count("\n") == 1


def _window(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lstmablate.bench.window", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _archive(out: Path) -> tuple[set[str], dict]:
    with tarfile.open(out / window_archive.ARCHIVE) as tar:
        return set(tar.getnames()), json.loads(tar.extractfile(window_files.STATE).read())


@pytest.mark.slow
def test_a_window_end_to_end_on_the_cpu(tmp_path):
    """The whole window with the CPU as its device and the tiny Dyck recipe as its plan:
    prepare; the first command installs the carried wheel, runs gpu-check's stages (a dry
    run: tiny shapes; the CUDA-only stages skipped), plans from the steps it timed, starts
    the runs detached and watches them; the second command watches and collects again."""
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_DYCK)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[dict(name="tiny", recipe=str(recipe), shorten=True, start_s=5,
                                      final_s=5)]]))
    base = tmp_path / "gpuwindow"
    r = _window("prepare", "--wheels", "", "--folder", str(base), "--plan", str(plan))
    assert r.returncode == 0, r.stderr
    probe = _wheel(base / "wheels", "gpuwindow_probe")
    stages = ["environment", "tests", "paths-fp32", "paths-bf16", "cells-fp32", "cells-tf32",
              "steps", "profile"]
    r = _window("run", "--minutes", "5", "--then", "2", "--out", str(tmp_path / "out1"),
                "--device", "cpu", "--folder", str(base), "--plan", str(plan),
                "--check-budget", "200", *[a for s in stages for a in ("--check-stage", s)],
                "--check-cell", "lstm", "--check-cell", "lstm-srnn",
                "--check-arg=--shape=3x4x6x2", "--check-arg=--repeats=1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out1 = sorted(p.name for p in (tmp_path / "out1").iterdir())
    assert out1[-2:] == [window_archive.SUMMARY, window_archive.ARCHIVE] and len(out1) == 4
    assert out1[0].startswith("gpu-check-cpu-") and out1[0].endswith(".json")
    names, state = _archive(tmp_path / "out1")
    assert state["install"]["installed"] == [probe.name]
    # gpu-check's dry run: what can run on a CPU ran; the CUDA-only stages were skipped
    check = state["check"]
    assert check["exit"] == 1 and list(check["stages"]) == stages
    for name in ("environment", "paths-fp32", "cells-fp32", "steps", "profile"):
        assert check["stages"][name]["status"] == "done", check["stages"][name]
    for name in ("tests", "cells-tf32"):
        assert check["stages"][name]["reason"] == "skipped: no CUDA (cpu)"
    record = [n for n in names if n.startswith("check/")]
    assert sorted(n.rsplit(".", 1)[1] for n in record) == ["json", "jsonl", "log", "md"]
    rows = json.loads((tmp_path / "out1" / out1[0]).read_text())["rows"]
    assert [(r["cell"], r["passed"]) for r in rows if r["kind"] == "path"
            and r["precision"] == "fp32"] == [("lstm", True), ("lstm-srnn", True)]
    if not any(r["fast_path"] for r in rows if r["kind"] == "path" and r["precision"] == "bf16"):
        assert "no bf16 fast path ran" in check["stages"]["paths-bf16"]["reason"]
    assert [(r["cell"], r["steps_per_epoch"], r["epochs"]) for r in rows if r["kind"] == "step"
            ] == [("lstm", 4, 2), ("lstm-srnn", 4, 2)]  # 64 sequences in batches of 16
    assert {r["cell"] for r in rows if r["kind"] == "profile"} == {
        "nn.LSTM", "lstm", "nn.RNN", "lstm-gates", "lstm-srnn", "lstm-srnn-hidden"}
    # the runs: planned whole, started, watched
    assert [(r["cell"], r["epochs"], r["shortened"]) for r in state["runs"]] == [
        ("lstm", 2, False), ("lstm-srnn", 2, False)]
    assert all(r["pid"] and r["state"] in ("running", "finished") for r in state["runs"])
    r = _window("watch", "--minutes", "3", "--out", str(tmp_path / "out2"), "--folder", str(base))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names, state = _archive(tmp_path / "out2")
    assert [c["mode"] for c in state["calls"]] == ["run", "watch"]
    assert [r["state"] for r in state["runs"]] == ["finished", "finished"]
    for cell in ("lstm", "lstm-srnn"):
        folder = f"runs/tiny/{cell}/seed-1"
        assert {f"{folder}/{n}" for n in (RunFiles.CONFIG, RunFiles.ENV, RunFiles.METRICS,
                                          RunFiles.RESULT, "scores/test.jsonl.gz")} <= names
        assert f"{folder}.log" in names
    assert not [n for n in names if n.endswith(".pt")]
    summary = (tmp_path / "out2" / window_archive.SUMMARY).read_text()
    assert "| tiny/lstm/seed-1 | 2 epochs |" in summary and "| finished |" in summary


@pytest.mark.parametrize("cells,expected", [
    ([["lstm"], ["lstm", "lstm-gates"]], ["lstm", "lstm-gates"]),
    ([["lstm"], None], []),
])
def test_the_check_times_only_the_cells_the_plan_trains(tmp_path, monkeypatch, cells, expected):
    """gpu-check's steps and step-capture stages time the plan's cells when every group
    names them (each cell once, in the plan's order), else every cell of each recipe; the
    step-capture stage times 'off' and 'graphs' only (a paper-size step's compilation
    outruns the stage's share of a window)."""
    seen: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        seen.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(window.subprocess, "run", fake_run)
    plan = [[dict(name=f"g{i}", recipe="nmt-multi30k", **({"cells": c} if c else {}))]
            for i, c in enumerate(cells)]
    args = window.argparse.Namespace(device="cpu", check_stage=["steps", "step-capture"],
                                     check_cell=[], check_arg=[])
    result = window._check(args, tmp_path / "base", {}, plan, 60.0)
    assert result["exit"] == 0 and result["steps"] == []
    (cmd,) = seen
    step_cells = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--step-cell"]
    modes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--capture-mode"]
    assert step_cells == expected and modes == ["off", "graphs"]
    assert cmd.count("--step-recipe") == 1


# -- land: the archive that came back, written into the records ---------------------------------
@pytest.fixture(scope="module")
def came_back(tmp_path_factory):
    """What a window sends back, as ``collect`` writes it: a tiny Dyck run trained to the end
    in the window's runs folder, and one that did not finish (its config and one evaluation)."""
    import io as text_io

    from rich.console import Console

    from lstmablate.run.runner import train_run

    root = tmp_path_factory.mktemp("land")
    base = root / "gpuwindow"
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_DYCK)
    train_run("dyck", "lstm", recipe=str(recipe), seed=1, out=window_files.runs_dir(base),
              console=Console(file=text_io.StringIO()), progress=False, threads=1)
    unfinished = _run_files(base, experiment="tiny", cell="lstm-srnn")
    unfinished.root.mkdir(parents=True)
    unfinished.config.write_text("task: dyck\n")
    unfinished.metrics.write_text(json.dumps(dict(step=4, epoch=1, accuracy=50.0)) + "\n")
    runs = [_run(None, experiment="tiny", cell="lstm"), _run(None, experiment="tiny", cell="lstm-srnn")]
    runs[0].state, runs[1].state = "finished", "stopped"
    window_archive.collect(dict(calls=[], runs=window_files.as_dicts(runs)), base, root / "out")
    return root / "out", RunFiles.of(window_files.runs_dir(base), "tiny", "lstm", 1)


#: the files a finished run's records hold, as landed
RECORD_FILES = sorted([RunFiles.CONFIG, RunFiles.ENV, RunFiles.METRICS, RunFiles.RESULT,
                       f"{RunFiles.SCORES}/test{RunFiles.SCORES_SUFFIX}"])


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_land_writes_the_finished_runs_records_as_train_wrote_them(came_back, tmp_path, capsys):
    out, trained = came_back
    into = tmp_path / "results"
    assert window.main(["land", str(out), "--into", str(into)]) == 0
    said = capsys.readouterr().out
    assert "not finished in the window (no result.json): tiny/lstm-srnn/seed-1; left out" in said
    result = json.loads(trained.result.read_text())
    assert f"landed {into / 'tiny' / 'lstm' / 'seed-1'}: {result['epochs']} epochs; test " in said
    assert f"runs landed in {into}: 1;" in said
    landed = _tree(into / "tiny" / "lstm" / "seed-1")
    assert sorted(landed) == RECORD_FILES
    assert landed == {name: (trained.root / name).read_bytes() for name in landed}
    assert [p.name for p in into.iterdir()] == ["tiny"] and not (into / "tiny" / "lstm-srnn").exists()
    from lstmablate.run.record import Run

    run = Run.open(into / "tiny" / "lstm" / "seed-1")
    assert run.result.test == json.loads(trained.result.read_text())["test"]
    assert len(run.scores("test").records) == 16


def test_land_replaces_records_only_with_force(came_back, tmp_path, capsys):
    out, trained = came_back
    into = tmp_path / "results"
    target = into / "tiny" / "lstm" / "seed-1"
    (target / "scores").mkdir(parents=True)
    (target / RunFiles.RESULT).write_text("{}")
    (target / "scores" / "dev.jsonl.gz").write_bytes(b"an older run's")
    (target / "NOTES.md").write_text("mine")
    before = _tree(into)
    assert window.main(["land", str(out / ARCHIVE_NAME), "--into", str(into)]) == 2
    err = capsys.readouterr().err
    assert "1 of the runs already have records" in err and "add --force" in err
    assert err.count("\n") == 1 and _tree(into) == before  # one paragraph; nothing written
    assert window.main(["land", str(out), "--into", str(into), "--force"]) == 0
    after = _tree(target)
    assert after.pop("NOTES.md") == b"mine"  # the user's own file stays
    assert sorted(after) == RECORD_FILES  # the older scores file is gone
    assert after[RunFiles.RESULT] == trained.result.read_bytes()


ARCHIVE_NAME = window_archive.ARCHIVE


def _crafted(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    import io as bytes_io

    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, bytes_io.BytesIO(data) if info.isreg() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("members, said", [
    ([(_member("runs/../../etc/cell/seed-1/result.json"), b"{}")], "is not a run's record"),
    ([(_member("/runs/e/c/seed-1/result.json"), b"{}")], "is not a run's record"),
    ([(_member("runs/e/c/seed-1/best.pt"), b"weights")], "is not a run's record"),
    ([(_member("runs/e/c/seed-1/scores/../result.json"), b"{}")], "is not a run's record"),
    ([(_member("runs/e/c/seed-1/result.json", tarfile.SYMTYPE, "/etc/passwd"), b"")],
     "is not a regular file"),
    ([(_member("runs/e/c/seed-1/config.yaml", tarfile.CHRTYPE), b"")], "is not a regular file"),
    ([(_member("runs/e/c/seed-1/metrics.jsonl"), b"{}\n")], "holds no finished run"),
])
def test_land_refuses_an_archive_that_is_not_a_windows(tmp_path, capsys, members, said):
    archive = _crafted(tmp_path / ARCHIVE_NAME, members)
    into = tmp_path / "results"
    assert window.main(["land", str(archive), "--into", str(into)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not into.exists() or not any(into.iterdir())


def test_land_refuses_a_run_whose_records_do_not_read(came_back, tmp_path, capsys):
    """A finished run of the archive whose result.json is damaged lands nowhere, and neither
    does any other run of the archive: each is read back as a run first."""
    out, _ = came_back
    with tarfile.open(out / ARCHIVE_NAME) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar if m.isreg()]
    members = [(m, b'{"test": "no numbers"}' if m.name.endswith("lstm/seed-1/result.json") else d)
               for m, d in members]
    archive = _crafted(tmp_path / ARCHIVE_NAME, members)
    into = tmp_path / "results"
    assert window.main(["land", str(archive), "--into", str(into)]) == 2
    err = capsys.readouterr().err
    assert "the run tiny/lstm/seed-1 does not read as a run's records" in err
    assert RunFiles.RESULT in err and (not into.exists() or not any(into.iterdir()))
    (tmp_path / "nothing.tar.gz").write_bytes(b"not an archive")
    assert window.main(["land", str(tmp_path / "nothing.tar.gz"), "--into", str(into)]) == 2
    assert "is not a gzip-compressed tar archive" in capsys.readouterr().err
