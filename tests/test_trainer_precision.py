"""``train.precision`` (``lstmablate/train/precision.py``): checked before a run writes
anything, recorded in the run's config and env.json, bf16 training whose loss falls (on
CPU: autocast in bfloat16, the cells on the Triton kernels under the interpreter), its
evaluation recomputed in the same precision, fp16 with a gradient scaler whose state is
part of ``last.pt``, and the float32 products' flags set alike for cuBLAS and cuDNN for the
whole run."""

from __future__ import annotations

import json

import pytest
import torch

from lstmablate.cells.kernels import interface
from lstmablate.cells.kernels.common import precision as flags
from lstmablate.cells.kernels.common import triton_support
from lstmablate.errors import ConfigError
from lstmablate.io import load_yaml
from lstmablate.run.runs import RunFiles
from lstmablate.train.precision import Precision, check_precision, in_effect

from cli_in_process import expect_error, run_cli


def _train(tmp_path, recipe, *sets, cell="lstm-srnn"):
    args = [a for s in sets for a in ("--set", s)]
    return run_cli("train", "--task", "dyck", "--cell", cell, "--recipe", str(recipe), *args,
                   "--out", "runs", "--threads", "1", cwd=tmp_path)


def _files(tmp_path, cell="lstm-srnn"):
    return RunFiles.of(tmp_path / "runs", "tiny", cell, 1)


def test_an_unknown_precision_is_refused(tmp_path, tiny_recipe):
    expect_error(_train(tmp_path, tiny_recipe, "train.precision=fp8"), "train.precision",
                 "'fp8'", "bf16, fp16, fp32, tf32")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="TF32 runs on a CUDA GPU")
def test_tf32_off_a_gpu_is_refused_before_anything_is_written(tmp_path, tiny_recipe):
    expect_error(_train(tmp_path, tiny_recipe, "train.precision=tf32"), "train.precision=tf32",
                 "this run is on cpu", "train.precision=fp32")
    assert not _files(tmp_path).root.exists()


@pytest.mark.skipif(not triton_support.interpreting(),
                    reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
def test_a_bf16_run_trains_records_its_precision_and_evaluates_alike(tmp_path, tiny_recipe,
                                                                     monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")  # the Triton kernels in bfloat16
    interface.forget_failures()  # (what failed in earlier tests of this process)
    r = _train(tmp_path, tiny_recipe, "train.precision=bf16", "train.max_epochs=3")
    assert r.returncode == 0, r.stderr
    files = _files(tmp_path)
    losses = [json.loads(line)["train_loss"] for line in files.metrics.read_text().splitlines()]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0], losses
    assert load_yaml(files.config)["train"]["precision"] == "bf16"
    env = json.loads(files.env.read_text())
    assert env["precision"] == {"train": "bf16", "autocast": "bfloat16", "device": "cpu",
                                "cublas_tf32": False, "cudnn_tf32": False,
                                "float32_matmul_precision": "highest"}
    assert set(env["kernels"]["paths"]) == {"lstm-srnn"}
    assert set(env["kernels"]["paths"]["lstm-srnn"]) == {"triton-recurrent"}
    assert not env["kernels"]["fallbacks"]
    r = run_cli("eval", str(files.root), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(files.result.read_text())
    assert json.loads(r.stdout)["loss"] == pytest.approx(result["test"]["loss"], abs=1e-12)


def test_an_fp16_run_scales_its_loss_and_keeps_the_scaler_in_last_pt(tmp_path, tiny_recipe,
                                                                      monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "0")  # the reference loop, under autocast
    r = _train(tmp_path, tiny_recipe, "train.precision=fp16", "train.max_steps=3")
    try:
        check_precision("fp16", torch.device("cpu"))
    except ConfigError:  # a PyTorch without float16 autocast on CPU: the refusal says so
        expect_error(r, "train.precision=fp16", "cpu")
        return
    assert r.returncode == 0, r.stderr
    files = _files(tmp_path)
    last = torch.load(files.last, weights_only=False)
    assert last["scaler"]["scale"] > 0
    env = json.loads(files.env.read_text())
    assert env["precision"]["autocast"] == "float16"
    assert set(env["kernels"]["paths"]["lstm-srnn"]) == {"reference"}


def test_the_products_flags_are_set_alike_for_the_run_and_restored(monkeypatch):
    """fp32 (the default): cuBLAS and cuDNN strict float32 — PyTorch's defaults would leave
    cuDNN's RNNs alone on TF32; tf32: both TF32; afterwards, the flags as they were."""
    assert flags.products_label() == "cublas fp32, cudnn tf32"  # PyTorch's defaults
    amp = Precision("fp32", torch.device("cpu"))
    with amp.products():
        assert flags.products_label() == "fp32"
    assert flags.products_label() == "cublas fp32, cudnn tf32"
    with flags.same_precision(True):
        assert flags.products_precision() == {"cublas_tf32": True, "cudnn_tf32": True,
                                              "float32_matmul_precision": "high"}
    assert torch.get_float32_matmul_precision() == "highest"
    assert in_effect("tf32", torch.device("cuda"))["cudnn_tf32"] is True


def test_the_kernel_record_counts_paths_per_cell():
    interface.reset_kernel_record()
    from lstmablate.cells import build_encoder

    enc = build_encoder("lstm-srnn", 3, 4, num_layers=2)
    enc(torch.randn(2, 5, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc(torch.randn(2, 5, 3))
    paths = interface.kernel_record()["paths"]["lstm-srnn"]
    assert paths.get("reference") == 2 and sum(paths.values()) == 4, paths
    interface.reset_kernel_record()
    assert interface.kernel_record()["paths"] == {}


def test_the_benchmark_times_both_sides_at_one_precision():
    """``bench_cells(precision=...)``: our cells and the cuDNN baselines with the float32
    products alike, the precision in every row (on CPU always fp32: TF32 is a CUDA format),
    the flags as they were afterwards."""
    from lstmablate import bench

    before = flags.products_precision()
    for precision in ("fp32", "tf32"):
        rows = bench.bench_cells(cells=["lstm-srnn"], shapes=["2x3x4x1"], threads=1, repeats=1,
                                 warmup=0, precision=precision)
        assert {r["cell"] for r in rows} >= {"nn.LSTM", "lstm-srnn"}
        assert {r["precision"] for r in rows} == {precision if torch.cuda.is_available()
                                                  else "fp32"}
    assert flags.products_precision() == before
    rows = bench.bench_cells(cells=["lstm-srnn"], shapes=["2x3x4x1"], threads=1, repeats=1,
                             warmup=0)
    assert {r["precision"] for r in rows} == {flags.products_label() if torch.cuda.is_available()
                                              else "fp32"}
    with pytest.raises(ConfigError, match="fp32 or tf32"):
        bench.bench_cells(cells=["lstm-srnn"], shapes=["2x3x4x1"], precision="bf16")


def test_a_run_trained_in_a_precision_this_device_lacks_is_evaluated_in_fp32():
    """A run trained at tf32 on a GPU, evaluated on a CPU (no TF32 there): the evaluation
    computes in fp32 instead of refusing."""
    from types import SimpleNamespace

    from lstmablate.run.runner import evaluation_precision

    cfg = SimpleNamespace(train=SimpleNamespace(precision="tf32"))
    with pytest.raises(ConfigError):
        Precision("tf32", torch.device("cpu"))
    amp = evaluation_precision(cfg, torch.nn.Linear(2, 2))
    assert amp.name == "fp32" and amp.low is None
