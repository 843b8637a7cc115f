"""One output rule for every writer (:mod:`lstmablate.io`), and one writer.

A regular file is replaced atomically; a character device or a named pipe (FIFO), reached
directly or through a link (``--out /dev/null``, ``/dev/stdout``, a shell's ``>(...)``), is
written into as a stream and never renamed over -- as root, as CI and containers run, a rename
over ``/dev/null`` would replace the machine's ``/dev/null`` by a file; a FIFO that no process
reads is refused at once; a directory, a socket or a block device is refused.  Each writing
command is tried on device nodes the test makes (copies of ``/dev/null`` and ``/dev/full``,
made with ``os.mknod``: root only, skipped otherwise) and on FIFOs: ``report`` (markdown and
csv), ``plot``, ``visualize``, ``bench --out``, ``eval --write-predictions``, ``data dyck``,
gpu-check and the GPU window's collection.  Commands whose output has companions (a PNG's CSV,
a JSON record's Markdown) write only the output itself into a device or a pipe.

And no module but ``io``'s writer (``lstmablate/io/write.py``) renames, replaces or fsyncs a
file (#67: one atomic writer).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from cli_in_process import expect_error, run_cli

from lstmablate import io
from lstmablate.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node (os.mknod) needs "
                             "root; CI runs the tests as root")


def device(path: Path, like: str = "/dev/null") -> Path:
    """A private character device with the numbers of ``like`` (a /dev/null or /dev/full)."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.stat(like).st_rdev)
    return path


def is_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


class Reader:
    """A thread reading a FIFO to its end (what ``cat FIFO`` or a shell's ``>(...)`` does)."""

    def __init__(self, path: Path):
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self.thread.start()

    def _read(self, path: Path) -> None:
        with open(path, "rb") as f:
            self.data = f.read()

    def result(self, timeout: float = 60) -> bytes:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the writer never closed the FIFO"
        return self.data


# -- the rule, in io ------------------------------------------------------------------------
@as_root
def test_a_device_is_written_into_never_replaced(tmp_path):
    null = device(tmp_path / "null")
    io.atomic_write_text(null, "text\n")
    assert is_device(null)
    assert not [p for p in tmp_path.iterdir() if p.name != "null"]  # no temporary file left
    full = device(tmp_path / "full", "/dev/full")
    with pytest.raises(UserError, match="No space left on device") as e:
        io.atomic_write_text(full, "text\n")
    assert "incomplete" in str(e.value) and is_device(full)
    link = tmp_path / "stdout"
    link.symlink_to(null)  # as /dev/stdout is a link: the device behind it is written into
    io.atomic_write_json(link, {"a": 1})
    assert link.is_symlink() and is_device(null)


def test_a_fifo_is_written_into_when_read_and_refused_at_once_when_not(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="named pipe .FIFO. that no process reads"):
        io.atomic_write_text(fifo, "nobody reads this\n")  # refused, never waited on
    reader = Reader(fifo)
    io.atomic_write(fifo, lambda f: (f.write(b"line 1\n"), f.seek(0), f.write(b"LINE")))
    assert reader.result() == b"LINE 1\n"  # (made in a file first: a writer may seek)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_or_a_socket_is_refused(tmp_path):
    with pytest.raises(UserError, match="it is a directory"):
        io.atomic_write_text(tmp_path, "x")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        with pytest.raises(UserError, match="it is a socket"):
            io.atomic_write_text(tmp_path / "sock", "x")
    finally:
        sock.close()
    assert io.output_kind(tmp_path / "new.txt") == io.FILE


def test_a_regular_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        io.atomic_write(path, lambda f: (f.write(b"half"), (_ for _ in ()).throw(RuntimeError)))
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    io.atomic_write_text(path, "new")
    assert path.read_text() == "new"


def test_rows_are_appended_to_a_regular_file_only(tmp_path):
    rows = tmp_path / "rows.jsonl"
    io.append_json_line(rows, {"b": 1, "a": 2})
    io.append_text(rows, "x\n")
    assert rows.read_text() == '{"a": 2, "b": 1}\nx\n'
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="it is a named pipe"):
        io.append_text(fifo, "x\n")  # (no reader: never waited on)
    link = tmp_path / "link.jsonl"
    link.symlink_to(rows)
    with pytest.raises(UserError, match="cannot write"):
        io.append_text(link, "x\n", nofollow=True)
    assert rows.read_text().count("\n") == 2


def test_yaml_is_imported_only_where_yaml_is_read_or_written():
    """The GPU tools write through io on a machine without PyYAML."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['yaml'] = None\nimport lstmablate.io as io, tempfile, os\n"
            "d = tempfile.mkdtemp()\nio.atomic_write_json(os.path.join(d, 'a.json'), {'a': 1})\n"
            "print(io.read_json(os.path.join(d, 'a.json')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "{'a': 1}", r.stderr


# -- every writing command ------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny Dyck run, trained once for the module."""
    from conftest import TINY_DYCK

    home = tmp_path_factory.mktemp("trained")
    (home / "tiny.yaml").write_text(TINY_DYCK)
    r = run_cli("train", "--task", "dyck", "--recipe", "tiny.yaml", "--out", "runs", "--set",
                "train.max_steps=2", "--threads", "1", cwd=home)
    assert r.returncode == 0, r.stderr
    return home


RUN = "runs/tiny/lstm/seed-1"


@as_root
@pytest.mark.parametrize("argv", [
    ["report", "runs"], ["report", "runs", "--format", "csv"], ["report", "runs", "--force"]])
def test_report_writes_into_a_device_without_replacing_it(trained, argv):
    null = device(trained / "null")
    try:
        r = run_cli(*argv, "--out", "null", cwd=trained)  # (--force not needed: nothing replaced)
        assert r.returncode == 0, r.stderr
        assert is_device(null)
        full = device(trained / "full", "/dev/full")
        expect_error(run_cli(*argv, "--out", "full", cwd=trained), "full", "No space left")
        assert is_device(full)
    finally:
        for name in ("null", "full"):
            if os.path.lexists(trained / name):
                os.unlink(trained / name)


def test_report_into_a_pipe_and_the_refusals(trained, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = Reader(fifo)
    r = run_cli("report", "runs", "--format", "csv", "--out", str(fifo), cwd=trained)
    assert r.returncode == 0, r.stderr
    r = run_cli("report", "runs", "--format", "csv", "--out", str(tmp_path / "r.csv"), cwd=trained)
    assert r.returncode == 0, r.stderr
    assert reader.result() == (tmp_path / "r.csv").read_bytes()
    assert (tmp_path / "r.csv").read_text().startswith("experiment,")
    expect_error(run_cli("report", "runs", "--out", str(fifo), cwd=trained),
                 "named pipe (FIFO) that no process reads")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        expect_error(run_cli("report", "runs", "--out", str(tmp_path / "sock"), "--force",
                             cwd=trained), "it is a socket")
    finally:
        sock.close()


@as_root
def test_plot_visualize_and_bench_write_only_the_output_into_a_device(trained, monkeypatch):
    from lstmablate import bench

    monkeypatch.setattr(bench.record, "measure", lambda *a, **k: (
        [], {"environment": {}, "machine_gflops": [None, None]}))
    made = [device(trained / name) for name in ("curves.png", "fig.png", "b.json", "null")]
    try:
        before = set(os.listdir(trained))
        for argv in (["plot", RUN, "--out", "curves.png"], ["plot", RUN, "--out", "null"],
                     ["visualize", RUN, "--text", "(a a)", "--out", "fig.png"],
                     ["visualize", RUN, "--text", "(a a)", "--out", "null"],
                     ["bench", "--quick", "--no-models", "--cell", "lstm", "--out", "b.json"],
                     ["bench", "--quick", "--no-models", "--cell", "lstm", "--out", "null"]):
            r = run_cli(*argv, cwd=trained)
            assert r.returncode == 0, (argv, r.stderr)
            assert "a device or a pipe" in r.stdout + r.stderr, argv
        assert set(os.listdir(trained)) == before  # no CSV, PDF or Markdown beside them
        assert all(is_device(p) for p in made)
    finally:
        for p in made:
            os.unlink(p)


def test_eval_writes_its_predictions_into_a_pipe_as_into_a_file(trained, tmp_path):
    r = run_cli("eval", RUN, "--write-predictions", str(tmp_path / "p.jsonl"), "--json",
                cwd=trained)
    assert r.returncode == 0, r.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = Reader(fifo)
    r2 = run_cli("eval", RUN, "--write-predictions", str(fifo), "--json", cwd=trained)
    assert r2.returncode == 0, r2.stderr
    assert reader.result() == (tmp_path / "p.jsonl").read_bytes()
    assert json.loads(r2.stdout) == json.loads(r.stdout)  # the metrics computed from the file
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@as_root
def test_eval_predictions_and_dyck_data_into_devices(trained, tmp_path):
    null = device(tmp_path / "null")
    r = run_cli("eval", RUN, "--write-predictions", str(null), cwd=trained)
    assert r.returncode == 0, r.stderr
    assert is_device(null)
    # a corpus whose training split is a device: written into, then refused when the command
    # reads its corpus back to check it (a device holds no corpus); the device stays
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    device(corpus / "train.txt")
    expect_error(run_cli("data", "dyck", "--out", str(corpus), "--train-sequences", "4",
                         "--dev-sequences", "2", "--test-sequences", "2", "--force",
                         cwd=tmp_path), "train.txt: it is a device")
    assert is_device(corpus / "train.txt")


# -- the GPU tools' files -------------------------------------------------------------------
@as_root
def test_the_windows_collection_writes_into_devices_it_finds(tmp_path):
    from dataclasses import asdict

    from lstmablate.bench import window_archive, window_files

    out = tmp_path / "out"
    out.mkdir()
    for name in (window_archive.ARCHIVE, window_archive.SUMMARY):
        device(out / name)
    run = window_files.Run(group="g", recipe="r", recipe_name="r", task="dyck", cell="lstm", seed=1,
                     experiment="exp", sets=[], epochs=1, full_epochs=1, steps_per_epoch=1,
                     estimate_s=1.0)
    state = dict(gpu="cpu", calls=[dict(mode="run", started="now", minutes=1)],
                 runs=[asdict(run)], not_started=[])
    window_archive.collect(state, tmp_path / "gpuwindow", out)
    assert is_device(out / window_archive.ARCHIVE) and is_device(out / window_archive.SUMMARY)


# -- one writer -----------------------------------------------------------------------------
#: the calls that rename, replace or fsync a file
FORBIDDEN = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("os", "fsync"),
             ("os", "fdatasync"), ("shutil", "move")}
#: the one writer: the output rule and the row streams (the rest of the io package reads)
WRITER = "lstmablate/io/write.py"
#: the calls the one-writer rule allows outside the writer, each with its reason
ALLOWED = {
    # the compiled library is written by the C compiler itself (no Python writer sees its
    # bytes), then renamed into the cache by the build so that concurrent builders never load
    # a half-written .so
    ("lstmablate/cells/kernels/common/native_build.py", "os.replace"),
}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in FORBIDDEN:
                yield f"{owner.id}.{node.func.attr}", node.lineno
            elif node.func.attr in ("rename", "renames"):  # Path.rename (str has none)
                yield f".{node.func.attr}", node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            for alias in node.names:
                if (node.module, alias.name) in FORBIDDEN:
                    yield f"from {node.module} import {alias.name}", node.lineno


def test_no_module_but_io_renames_replaces_or_fsyncs():
    """``Path.replace`` cannot be told from ``str.replace`` by the syntax: it is found as
    ``os.replace`` is, by a look at what is left (none today)."""
    found, allowed_seen = [], set()
    for folder in ("lstmablate", "tasks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == WRITER:
                continue
            for call, line in _calls(ast.parse(path.read_text(encoding="utf-8"))):
                if (rel, call) in ALLOWED:
                    allowed_seen.add((rel, call))
                else:
                    found.append(f"{rel}:{line}: {call}")
    assert not found, "write through lstmablate.io instead:\n" + "\n".join(found)
    assert allowed_seen == ALLOWED, f"no longer needed, remove from ALLOWED: {ALLOWED - allowed_seen}"
    io_calls = {c for c, _ in _calls(ast.parse((ROOT / WRITER).read_text()))}
    assert {"os.replace", "os.fsync"} <= io_calls  # (the rule itself: the test can fail)
