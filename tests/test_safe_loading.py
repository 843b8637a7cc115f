"""Nothing loaded from disk executes code.

Checkpoints are read with PyTorch's safe loader (``weights_only=True``) and hold only plain
data; a checkpoint carrying a real pickle ``__reduce__`` payload (one that writes a marker
file when unpickled) is refused with exit code 2 by every command that reads one -- ``eval``,
``train --resume``, ``visualize`` and ``sweep`` -- and the marker is never created; a payload
calling ``os.system`` (whose module PyTorch blocks outright, in other words) is refused for
safety in the same terms, never called truncated or corrupt.  The
other files the toolkit reads (recipes, a run's config.yaml, its artefacts) are plain YAML or
JSON, read with loaders that construct no Python objects.  Checkpoints written before the RNG
state was stored as plain data still load and resume exactly.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from lstmablate.run.runner import train_run
from lstmablate.run.runs import RunFiles
from lstmablate.train.checkpoint import load_checkpoint, rng_state, set_rng_state

from cli_in_process import expect_error, run_cli

QUIET = Console(file=io.StringIO())


class Payload:
    """Unpickling this runs ``open(marker, 'w').write(...)``: what a malicious file would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def plant(path: Path, marker: Path, where: str = "carry") -> None:
    """Rewrite a real checkpoint with the payload inside it (as a malicious sharer would)."""
    ckpt = load_checkpoint(path)
    ckpt[where] = {"state": Payload(marker)}
    torch.save(ckpt, path)


@pytest.fixture
def trained(tmp_path, tiny_recipe):
    """An interrupted-looking dyck run (no result.json) with last.pt and best.pt."""
    out = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET,
                    progress=False, overrides=["train.max_steps=2"], threads=1)
    RunFiles(out.run_dir).result.unlink()
    return out.run_dir


def test_a_checkpoint_with_a_pickle_payload_is_refused_everywhere(tmp_path, tiny_recipe, trained):
    marker = tmp_path / "MARKER"
    for name in (RunFiles.LAST, RunFiles.BEST):
        plant(trained / name, marker)
    # the payload is real: the unsafe loader runs it
    torch.load(RunFiles(trained).last, weights_only=False)
    assert marker.read_text() == "code ran"
    marker.unlink()

    rel = str(trained.relative_to(tmp_path))
    train = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
             "--set", "train.max_steps=2", "--threads", "1"]
    for argv in (["eval", rel], ["eval", rel, "--checkpoint", "last"], [*train, "--resume"],
                 ["visualize", rel, "--text", "(a (b b) a)", "--out", "w.png"],
                 ["sweep", str(tiny_recipe), "--out", "runs", "--set", "train.max_steps=2"]):
        r = run_cli(*argv, cwd=tmp_path)
        text = expect_error(r, "was refused", "exec", "Nothing in it was loaded or run")
        assert not marker.exists(), (argv, "the payload ran")
        assert ".pt" in text
    assert not (tmp_path / "w.png").exists()


def test_the_refusal_names_the_file_and_does_not_depend_on_where_the_payload_sits(tmp_path, trained):
    from lstmablate.errors import CheckpointError

    marker = tmp_path / "MARKER"
    clean = RunFiles(trained).last.read_bytes()
    for where in ("model", "optimizer", "rng", "position"):
        RunFiles(trained).last.write_bytes(clean)
        plant(RunFiles(trained).last, marker, where)
        with pytest.raises(CheckpointError, match=r"last.pt was refused: it names the Python "
                                                  r"global `exec`"):
            load_checkpoint(RunFiles(trained).last)
        assert not marker.exists()


class SystemCall:
    """Unpickling this runs ``os.system('touch marker')``: PyTorch's safe loader blocks the module
    (``posix`` on Linux) outright, with other wording than for ``exec``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_an_os_system_payload_is_refused_for_safety_not_called_truncated(tmp_path, tiny_recipe,
                                                                        trained):
    """torch's loader says "module posix is blocked" for os.system: the message says the file
    holds code that is refused for safety and that nothing ran, never "truncated or corrupt"."""
    import os

    marker = tmp_path / "MARKER"
    for name in (RunFiles.LAST, RunFiles.BEST):
        ckpt = load_checkpoint(trained / name)
        ckpt["carry"] = {"state": SystemCall(marker)}
        torch.save(ckpt, trained / name)
    blocked = os.system.__module__  # posix (nt on Windows)
    rel = str(trained.relative_to(tmp_path))
    train = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
             "--set", "train.max_steps=2", "--threads", "1", "--resume"]
    for argv in (["eval", rel], ["eval", rel, "--checkpoint", "last"], train):
        text = expect_error(run_cli(*argv, cwd=tmp_path), "was refused",
                              f"the Python global `{blocked}.system`", f"module `{blocked}`",
                              "refused for safety", "holds code or objects",
                              "Nothing in it was loaded or run (no code was executed)")
        assert "truncated" not in text and "corrupt" not in text, text
        assert not marker.exists(), (argv, "the payload ran")


def test_the_loaders_refusals_are_told_apart_from_damage(tmp_path):
    """What the safe loader says about a file it refuses for what it holds (a global it does not
    allow or blocks, an object it will not build) is a refusal for safety; a file that is not
    a pickle it can read is truncated or corrupt."""
    import os
    import pickle

    from lstmablate.errors import CheckpointError

    path = tmp_path / "x.pt"
    for payload, fragment in (
            (lambda: torch.save({"format": 1, "x": SystemCall(tmp_path / "M")}, path),
             "refused for safety"),
            (lambda: path.write_bytes(pickle.dumps({"x": SystemCall(tmp_path / "M")}, protocol=2)),
             "refused for safety"),
            (lambda: torch.save({"format": 1, "x": Payload(tmp_path / "M")}, path),
             "refused for safety"),
            (lambda: path.write_bytes(os.urandom(3000)), "truncated or corrupt"),
            (lambda: path.write_bytes(b""), "truncated or corrupt")):
        payload()
        with pytest.raises(CheckpointError, match=fragment):
            load_checkpoint(path)
    assert not (tmp_path / "M").exists()


def test_new_checkpoints_hold_plain_data_only(trained):
    for name in (RunFiles.LAST, RunFiles.BEST):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(trained / name) == []


def test_rng_state_round_trips_as_plain_data():
    np.random.randn()  # a cached Gaussian is part of numpy's state
    state = rng_state()
    expected = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True))
    got = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])


def test_a_checkpoint_written_by_the_previous_format_still_loads_and_resumes(tmp_path, tiny_recipe,
                                                                           monkeypatch):
    """Earlier checkpoints hold numpy's RNG state as numpy's own tuple (an ndarray inside): the
    safe loader allows exactly what rebuilds that array, and the resumed run equals an
    uninterrupted one."""
    from lstmablate.train.trainer import Trainer

    args = dict(recipe=str(tiny_recipe), console=QUIET, progress=False, threads=1,
                overrides=["train.max_steps=6", "train.eval_every=3"])
    whole = train_run("dyck", "lstm", out=tmp_path / "whole", **args)
    real = Trainer._dev_evaluation

    def stop_after_first_evaluation(self, lr):  # a Ctrl-C right after step 3's evaluation
        real(self, lr)
        self._stop_signal = "SIGINT"

    monkeypatch.setattr(Trainer, "_dev_evaluation", stop_after_first_evaluation)
    part = train_run("dyck", "lstm", out=tmp_path / "part", **args)
    monkeypatch.setattr(Trainer, "_dev_evaluation", real)
    assert part.interrupted
    last = RunFiles(part.run_dir).last
    ckpt = load_checkpoint(last)
    s = ckpt["rng"]["numpy"]
    ckpt["rng"]["numpy"] = ("MT19937", s["key"].numpy().astype(np.uint32), s["pos"],
                            s["has_gauss"], s["gauss"])  # what np.random.get_state() gives
    torch.save(ckpt, last)  # as the previous version wrote it
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(last)
    resumed = train_run("dyck", "lstm", out=tmp_path / "part", resume=True, **args)
    assert RunFiles(part.run_dir).metrics.read_text() == \
        RunFiles(whole.run_dir).metrics.read_text()
    assert resumed.result.test == whole.result.test


def test_recipes_run_configs_and_set_values_construct_no_python_objects(tmp_path, trained):
    marker = tmp_path / "MARKER"
    tag = f"!!python/object/apply:os.system ['touch {marker}']"
    (tmp_path / "evil.yaml").write_text(f"task: dyck\ntrain:\n  lr: {tag}\n")
    expect_error(run_cli("train", "--task", "dyck", "--recipe", "evil.yaml", "--out", "fresh",
                           cwd=tmp_path), "evil.yaml")
    expect_error(run_cli("train", "--task", "dyck", "--out", "fresh", "--set",
                           f"train.betas=[{tag}]", cwd=tmp_path), "train.betas")
    config = RunFiles(trained).config
    config.write_text(config.read_text().replace("task: dyck", f"task: {tag}", 1))
    r = run_cli("eval", str(trained), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()
    assert not (tmp_path / "fresh").exists()
