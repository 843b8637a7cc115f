"""Every option of ``lstmablate bench`` and ``lstmablate visualize`` is checked before anything is
measured or any model is loaded.

A property-style walk feeds each option the hostile values of
tests/test_config_validation_property.py (nan, inf, 0, -1, huge numbers, words, YAML, deep
nesting) and the values a probe found (``--threads 100000`` crashed OpenMP, ``--shape
0x0x0x0`` and ``--repeats 0`` ended in tracebacks, ``--text ""`` too, a 16,000-token text ran
for minutes): each is refused with exit code 2 and one paragraph naming the option, or is a
valid value -- which reaches a sentinel put where the measuring starts (``bench``) or where
the run's model is loaded (``visualize``), so the walk runs in-process in seconds.  Running
out of memory while measuring or drawing is the one-paragraph message ``train`` and ``eval``
give.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from lstmablate.bench import options as bench_options, record
from lstmablate.bench import cells as bench_cells_module
from lstmablate.errors import UserError
from lstmablate.results import visualize as visualize_module
from lstmablate.run import runner

from cli_in_process import run_cli
from conftest import TINY_DYCK
from test_config_validation_property import VALUES

SENTINEL = "reached the sentinel"


class Reached(UserError):
    """Raised where measuring would start or the model would load: the value passed every
    check."""


def _reached(*args, **kwargs):
    raise Reached(SENTINEL)


@pytest.fixture
def bench_sentinel(monkeypatch, tmp_path):
    """``bench`` stops where it would start measuring (the environment is its first look at
    the machine, before the matmul rate and the benchmarks)."""
    monkeypatch.setattr(record, "environment", _reached)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A trained tiny Dyck run (one layer, two steps), shared by the tests of this file."""
    root = tmp_path_factory.mktemp("viz")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_DYCK)
    outcome = runner.train_run("dyck", "lstm", recipe=str(recipe), out=root / "runs",
                               console=Console(file=io.StringIO()), progress=False, threads=1,
                               overrides=["train.max_steps=2"])
    return outcome.run_dir


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check_refusal(context: str, r, names: tuple[str, ...]) -> str | None:
    """What is wrong with a command's answer to a value it must refuse (None: exit 2, one
    paragraph naming the option, no traceback, the sentinel not reached)."""
    text = " ".join(r.stderr.split())
    if r.returncode != 2:
        return f"{context}: exit {r.returncode}: {r.stderr[-300:]}"
    if "Traceback" in r.stderr:
        return f"{context}: a traceback"
    if "\n\n" in r.stderr.strip():
        return f"{context}: not one paragraph: {r.stderr!r}"
    if SENTINEL in text:
        return f"{context}: accepted"
    if not any(n in text for n in names):
        return f"{context}: the message names none of {names}: {text[:300]}"
    return None


# ----------------------------------------------------------------- bench: the probe's values

BENCH = ("bench", "--quick", "--no-models", "--cell", "lstm")

BENCH_REFUSED = [
    (["--shape", "0x0x0x0"], "--shape 0x0x0x0: the batch must be an integer between 1 and 8,192"),
    (["--shape", "20x35x0x2"], "the hidden size must be an integer between 1 and 32,768"),
    (["--shape", "20x35x650x0"], "the layers must be an integer between 1 and 64"),
    (["--shape", "8192x1000x650x2"], "the tokens of a batch (batch x steps) must be an integer "
                                     "between 1 and 1,000,000"),
    (["--shape", "1x1x1x1xfoo"], "--shape '1x1x1x1xfoo': use one of ptb-200, ptb-650, parser-400"),
    (["--shape", "20x35x650"], "--shape '20x35x650': use one of"),
    (["--shape", "8192x122x32768x64"], "--shape 8192x122x32768x64 needs at least"),
    (["--repeats", "0"], "--repeats must be an integer between 1 and 10,000, got 0"),
    (["--repeats", "-1"], "--repeats must be an integer between 1 and 10,000, got -1"),
    (["--model-repeats", "0"], "--model-repeats must be an integer between 1 and 10,000"),
    (["--threads", "0"], "--threads must be between 1 and"),
    (["--threads", "100000"], "leave it out for the default (the cores less the machine's load"),
    (["--device", "cuda:x"], "--device must be cpu, cuda, cuda:N or auto, got 'cuda:x'"),
    (["--device", "gpu"], "--device must be cpu, cuda, cuda:N or auto"),
    (["--cell", "nosuch"], "--cell: unknown cell 'nosuch'. Valid choices:"),
    (["--cell", "lstn"], "--cell: unknown cell 'lstn'. Did you mean 'lstm'?"),
]


@pytest.mark.parametrize("argv, message", BENCH_REFUSED,
                         ids=[" ".join(a) for a, _ in BENCH_REFUSED])
def test_bench_refuses_what_the_probe_typed_before_measuring(bench_sentinel, argv, message):
    r = run_cli(*BENCH, *argv, cwd=bench_sentinel)
    assert check_refusal(" ".join(argv), r, (argv[0],)) is None, r.stderr
    assert message in " ".join(r.stderr.split())
    assert not list(bench_sentinel.iterdir())


def test_bench_cuda_without_cuda_gives_trains_message(bench_sentinel):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run_cli(*BENCH, "--device", "cuda", cwd=bench_sentinel)
    assert check_refusal("--device cuda", r, ("--device cuda",)) is None, r.stderr
    assert "this PyTorch build sees no CUDA GPU" in " ".join(r.stderr.split())


def test_bench_model_size_is_checked_before_the_cells_are_timed(bench_sentinel):
    r = run_cli("bench", "--quick", "--cell", "lstm", "--model-size", "huge", cwd=bench_sentinel)
    assert check_refusal("--model-size huge", r, ("--model-size",)) is None, r.stderr
    r = run_cli(*BENCH, "--model-size", "medium", cwd=bench_sentinel)
    assert check_refusal("--no-models --model-size", r, ("--model-size",)) is None, r.stderr
    assert "--no-models leaves out" in " ".join(r.stderr.split())


def test_bench_thread_count_that_crashed_openmp_is_refused(tmp_path):
    """``bench --threads 100000`` crashed libgomp (exit 139): a process of its own."""
    r = subprocess.run([sys.executable, "-m", "lstmablate", *BENCH, "--threads", "100000"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--threads must be between 1 and" in " ".join(r.stderr.split())


def test_bench_shape_too_big_for_the_free_memory_is_refused_before_allocating(monkeypatch):
    """A shape within every bound that still does not fit: refused from the estimate, with
    the memory it needs and the memory there is."""
    monkeypatch.setattr(bench_options, "available_bytes", lambda device: 2**30)
    shape = bench_cells_module.parse_shape("64x100x4096x4")
    assert shape.min_bytes() > 2**30
    with pytest.raises(UserError, match=r"--shape 64x100x4096x4 needs at least .* GiB .*, but "
                                        r"cpu has 1.0 GiB free; use a smaller batch"):
        record.check_options(["lstm"], ["64x100x4096x4"], threads=1, device="cpu", repeats=1,
                             quick=True, model_sizes=[])
    record.check_options(["lstm"], ["4x5x8x1"], threads=1, device="cpu", repeats=1, quick=True,
                         model_sizes=[])


def test_bench_out_of_memory_while_timing_is_the_message_train_gives(bench_sentinel, monkeypatch):
    """Running out of memory while timing (a cell needs more than the estimate): the
    one-paragraph message of ``train`` and ``eval``, naming the shape."""
    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't "
                           "allocate memory: you tried to allocate 107374182400 bytes.")

    monkeypatch.setattr(record, "environment", lambda *a, **k: {})
    monkeypatch.setattr(bench_cells_module, "_bench_shape", no_memory)
    r = run_cli(*BENCH, "--shape", "4x5x8x1", "--threads", "1", cwd=bench_sentinel)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "out of memory while timing the cells at shape 4x5x8x1 on cpu" in text
    assert "Lower what sets the memory" in text


def test_bench_accepts_good_values_of_every_option(bench_sentinel):
    for argv in (["--threads", "1"], ["--repeats", "1"], ["--model-repeats", "10000"],
                 ["--device", "cpu"], ["--device", "auto"], ["--shape", "4x5x8x1xbi"],
                 ["--shape", "4,5,8,1"], ["--shape", "ptb-650"], ["--cell", "gru"],
                 ["--model-size", "large"]):
        args = [*BENCH, *argv] if argv[0] != "--model-size" else ["bench", "--quick", *argv]
        r = run_cli(*args, cwd=bench_sentinel)
        assert r.returncode == 2 and SENTINEL in r.stderr, (argv, r.stderr)


# ----------------------------------------------------------------- bench: the walk

#: every option of bench that takes a value -> the names its refusal may give
BENCH_OPTIONS = {
    "--cell": ("--cell",), "--shape": ("--shape",), "--threads": ("--threads",),
    "--device": ("--device",), "--repeats": ("--repeats",),
    "--model-repeats": ("--model-repeats",), "--model-size": ("--model-size",),
    # (the output guard's own part: a name the file system refuses is its error message)
    "--out": ("--out", "cannot write", "the operating system refused"),
}
#: the hostile values an option may take (it may still refuse them); any other is refused
BENCH_MAY_ACCEPT = {"--out": set(VALUES)}


def walk(command: str, argv_of, options: dict[str, tuple[str, ...]],
         may_accept: dict[str, set[str]], cwd: Path) -> list[str]:
    """Every value of :data:`VALUES` through every option (``argv_of(option, value)`` is the
    command line): what went wrong, one line each (empty: every value refused with exit 2 and
    one paragraph naming the option, or one ``may_accept`` lets through that reached the
    sentinel; nothing written in ``cwd``)."""
    failures = []
    for option, names in options.items():
        for value_name, value in VALUES.items():
            r = run_cli(*argv_of(option, value), cwd=cwd)
            context = f"{command} {option} {value_name}"
            if SENTINEL in r.stderr and value_name in may_accept.get(option, ()):
                continue
            problem = check_refusal(context, r, names)
            if problem:
                failures.append(problem)
            if list(cwd.iterdir()):
                failures.append(f"{context}: wrote {list(cwd.iterdir())}")
    return failures


def test_every_option_of_bench_is_checked_before_measuring(bench_sentinel, capsys):
    def argv_of(option, value):
        return [*BENCH, option, value] if option != "--model-size" else \
            ["bench", "--quick", option, value]

    failures = walk("bench", argv_of, BENCH_OPTIONS, BENCH_MAY_ACCEPT, bench_sentinel)
    with capsys.disabled():
        print(f"\n[bench options] {len(BENCH_OPTIONS)} options x {len(VALUES)} values: "
              "every bad value refused before measuring")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------- visualize

@pytest.fixture
def viz_sentinel(monkeypatch, tmp_path):
    """``visualize`` stops where it would load the run's model."""
    monkeypatch.setattr(visualize_module, "load_run_model", _reached)
    monkeypatch.chdir(tmp_path)
    return tmp_path


LONG_TEXT = " ".join(["(a"] * 8000 + ["a)"] * 8000)

VISUALIZE_REFUSED = [
    (["--text", ""], "--text has no tokens"),
    (["--text", "  \t "], "--text has no tokens"),
    (["--text", LONG_TEXT], "--text: the number of tokens must be an integer between 1 and 256, "
                            "got 16000"),
    (["--layer", "0"], "--layer must be an integer between 1 and 64, got 0"),
    (["--layer", "-1"], "--layer must be an integer between 1 and 64, got -1"),
    (["--layer", "99"], "--layer must be an integer between 1 and 64, got 99"),
    (["--checkpoint", ""], "--checkpoint must be best or last, got ''"),
    (["--checkpoint", "../last"], "--checkpoint must be best or last, got '../last'"),
]


@pytest.mark.parametrize("argv, message", VISUALIZE_REFUSED,
                         ids=[" ".join(a)[:30] for a, _ in VISUALIZE_REFUSED])
def test_visualize_refuses_what_the_probe_typed_before_loading(viz_sentinel, tiny_run, argv,
                                                               message):
    """Refused before the model loads (a sentinel stands there), nothing written, the run
    folder unchanged."""
    before = snapshot(tiny_run)
    args = {"--text": "(a (b b) a)", **dict(zip(argv[::2], argv[1::2]))}
    flat = [x for kv in args.items() for x in kv]
    r = run_cli("visualize", tiny_run, *flat, "--out", "w.png", cwd=viz_sentinel)
    assert check_refusal(" ".join(argv)[:40], r, (argv[0],)) is None, r.stderr
    assert message in " ".join(r.stderr.split())
    assert not list(viz_sentinel.iterdir()) and snapshot(tiny_run) == before


def test_visualize_layer_beyond_the_runs_layers_is_refused_after_loading(tiny_run, tmp_path):
    r = run_cli("visualize", tiny_run, "--text", "(a (b b) a)", "--layer", "2", "--out", "w.png",
                cwd=tmp_path)
    assert check_refusal("--layer 2", r, ("--layer",)) is None, r.stderr
    assert "--layer must be in 1..1 for this run" in " ".join(r.stderr.split())
    r = run_cli("visualize", tiny_run, "--text", "(a (b b) a)", "--checkpoint", "last",
                "--out", "w.png", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "w.png").exists(), r.stderr


def test_visualize_out_of_memory_is_the_message_eval_gives(tiny_run, tmp_path, monkeypatch):
    """A run too big for memory: ``visualize`` ends as ``eval`` of the same run does."""
    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           "107374182400 bytes.")

    before = snapshot(tiny_run)
    monkeypatch.setattr(runner, "build_model", no_memory)
    shown = {}
    commands = {"eval": ["eval", tiny_run],
                "visualize": ["visualize", tiny_run, "--text", "(a a)", "--out", "w.png"]}
    for command, argv in commands.items():
        r = run_cli(*argv, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (command, r.stderr)
        shown[command] = " ".join(r.stderr.split())
    assert f"out of memory while evaluating {tiny_run}" in shown["eval"]
    assert f"out of memory while drawing {tiny_run}" in shown["visualize"]
    advice = "Lower what sets the memory"
    assert advice in shown["eval"] and advice in shown["visualize"]
    assert not (tmp_path / "w.png").exists() and snapshot(tiny_run) == before


def test_visualize_draws_a_dollar_in_the_text_as_written():
    """A word of --text with "$" in it (``$\\frac$``) ended in matplotlib's mathtext parser
    (a traceback); the labels are the user's words, drawn as written."""
    import torch

    from lstmablate.cells import build_encoder
    from lstmablate.results.figures import draw_weight_norms, weight_norms

    tokens = ["$x", "a$b$c", r"$\frac$"]
    layers = weight_norms(build_encoder("lstm", 5, 4), torch.randn(1, 3, 5))
    fig = draw_weight_norms(layers[0], tokens)
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == tokens


#: every option of visualize that takes a value -> the names its refusal may give
VISUALIZE_OPTIONS = {
    "--text": ("--text",), "--layer": ("--layer",), "--checkpoint": ("--checkpoint",),
    "--out": ("--out",), "--data-dir": ("--data-dir", "data directory"),
}
VISUALIZE_MAY_ACCEPT = {"--text": set(VALUES), "--data-dir": set(VALUES)}


def test_every_option_of_visualize_is_checked_before_the_model_loads(viz_sentinel, tiny_run,
                                                                     capsys):
    good = {"--text": "(a a)", "--out": "w.png"}

    def argv_of(option, value):
        return ["visualize", tiny_run, *[x for kv in {**good, option: value}.items() for x in kv]]

    failures = walk("visualize", argv_of, VISUALIZE_OPTIONS, VISUALIZE_MAY_ACCEPT, viz_sentinel)
    for option, value in (("--checkpoint", "best"), ("--checkpoint", "last"), ("--layer", "1"),
                          ("--layer", "64"), ("--text", " ".join(["(a a)"] * 128))):
        r = run_cli(*argv_of(option, value), cwd=viz_sentinel)
        if SENTINEL not in r.stderr:
            failures.append(f"visualize {option} {value[:20]}: refused: {r.stderr[-300:]}")
    with capsys.disabled():
        print(f"\n[visualize options] {len(VISUALIZE_OPTIONS)} options x {len(VALUES)} values: "
              "every bad value refused before the model loads")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------- --device, shared with train

@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:١", "CPU", "", "cuda:0:1"])
def test_a_misspelt_device_is_refused_by_every_command(device):
    with pytest.raises(UserError, match="--device must be cpu, cuda, cuda:N or auto"):
        runner.pick_device(device)
    with pytest.raises(UserError, match="--device must be cpu, cuda, cuda:N or auto"):
        bench_options.check_device(device)
