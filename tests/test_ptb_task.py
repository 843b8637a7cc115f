"""The ``ptb`` task plugin: batching and carried state, loss scale, evaluation protocol,
initialisation, training, data checks and the recipes (the TF PTB tutorial's protocol)."""

from __future__ import annotations

import functools
import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tolerance import assert_close

from lstmablate.cells import build_encoder
from lstmablate.recipes import recipe_seeds, load_recipe, resolve_config
from lstmablate.errors import DataError
from lstmablate.run.runs import RunFiles
from lstmablate.task import get_task
from lstmablate.train.optim import Schedule, build_optimizer
from lstmablate_tasks.ptb import data as P
from lstmablate_tasks.ptb.evaluate import (read_predictions, sequential_logprobs,
                                           stream_logprobs)
from lstmablate_tasks.ptb.task import PTBData, PTBEval, PTBModel, PTBTask

from item_scores_check import assert_round_trip

FIXTURES = Path(__file__).parent / "fixtures"
PAPER_CELLS = ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden", "lstm-gates"]


def _real_dir() -> Path:
    from conftest import skip_without_real_data

    return skip_without_real_data("ptb")


def fixture_task(level: str = "word", batch_size: int = 2, num_steps: int = 3,
                 data_dir: Path = FIXTURES, **model) -> PTBTask:
    model = {"hidden_size": 8, "num_layers": 2, "dropout": 0.0, "init_scale": 0.1, **model}
    task = PTBTask(PTBData(level=level, batch_size=batch_size, num_steps=num_steps, verify=False),
                   PTBModel(**model), data_dir)
    task.use_artefacts(task.build_artefacts())
    task.setup()
    return task


def sequential_nll(model, stream, chunk):
    _, lp = sequential_logprobs(model, stream, chunk)
    return -float(lp.sum()), lp.numel()


def stream_nll(model, stream, batch_size, num_steps):
    _, lp = stream_logprobs(model, stream, batch_size, num_steps)
    return -float(lp.sum()), lp.numel()


def build(task: PTBTask, cell: str = "lstm", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return task.build_model(functools.partial(build_encoder, cell))


# ----------------------------------------------------------------------------- registry


def test_registered_under_entry_point_with_protocol():
    cls = get_task("ptb")
    assert cls is PTBTask
    assert cls.primary.name == "ppl" and not cls.primary.higher_is_better
    assert {m.name for m in cls.metrics} == {"ppl", "nll", "bpc"}
    assert (cls.dev_split, cls.test_split) == ("valid", "test")
    assert "batch size 1" in cls.eval_protocol and "num_steps 1" in cls.eval_protocol


# ----------------------------------------------------------------------------- batching


def test_batches_are_contiguous_rows_with_shifted_targets_in_fixed_order():
    task = fixture_task()
    train = task.corpus.train  # 53 tokens: 2 rows of 26, (26 - 1) // 3 = 8 minibatches
    plan = task.train_plan(0, torch.Generator().manual_seed(1))
    batches = list(plan)
    assert len(plan) == len(batches) == 8
    # indexable: batch i is the same whether or not the earlier ones were built (resume)
    assert all(torch.equal(plan[i][0], batches[i][0]) for i in (7, 3, 0))
    xs = torch.cat([x for x, _ in batches], dim=1)
    ys = torch.cat([y for _, y in batches], dim=1)
    rows = train[:52].view(2, 26)
    assert torch.equal(xs, rows[:, :24])  # each row continues across minibatches
    assert torch.equal(ys, rows[:, 1:25])  # targets = inputs shifted by one
    # no shuffling: any epoch and any generator give the same minibatches
    again = list(task.train_plan(5, torch.Generator().manual_seed(99)))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))


def test_carry_is_the_detached_final_state_and_continues_the_stream():
    task = fixture_task()
    model = build(task, "lstm")
    model.train()  # dropout 0: deterministic
    (x1, y1), (x2, y2) = list(task.train_plan(0, torch.Generator()))[:2]
    out1 = task.loss(model, (x1, y1), task.init_carry(model))
    carry = out1.carry
    assert isinstance(carry, tuple) and len(carry) == 2  # (h, c)
    assert all(s.shape == (2, 2, 8) and not s.requires_grad and s.grad_fn is None for s in carry)
    _, final = model.encoder(model.embedding(x1))
    assert all(torch.allclose(a, b) for a, b in zip(carry, final))
    # the second batch, started from the carry, continues the first: same logits as one
    # pass over both windows, and no gradient flows back into the first window
    out2 = task.loss(model, (x2, y2), carry)
    logits_both, _ = model(torch.cat([x1, x2], dim=1))
    nll2 = nn.functional.cross_entropy(logits_both[:, 3:].reshape(-1, logits_both.shape[-1]),
                                       y2.reshape(-1), reduction="none").view(2, 3)
    assert_close(out2.loss, nll2.mean(0).sum())  # float32: two passes vs one, to rounding
    out2.loss.backward()  # would fail or touch batch 1's graph if the carry were attached
    # a cell without a memory cell carries (h,) only
    s_model = build(task, "lstm-gates")
    out = task.loss(s_model, (x1, y1), None)
    assert len(out.carry) == 1 and out.carry[0].shape == (2, 2, 8)


def test_loss_is_num_steps_times_mean_token_nll():
    task = fixture_task(batch_size=2, num_steps=4)
    model = build(task, "lstm-srnn")
    x, y = task.train_plan(0, torch.Generator())[0]
    out = task.loss(model, (x, y), None)
    logits, _ = model(x)
    mean_nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert_close(out.loss.item(), 4 * mean_nll.item())  # float32, another reduction order
    assert out.weight == 8


# ----------------------------------------------------------------------------- evaluation


def hand_nll(model: nn.Module, stream: torch.Tensor) -> tuple[float, int]:
    """The tutorial's test loop written out: batch 1, num_steps 1, state carried."""
    model.eval()
    total, state = 0.0, None
    with torch.no_grad():
        for t in range(stream.numel() - 1):
            logits, state = model(stream[t].view(1, 1), state)
            total -= torch.log_softmax(logits[0, 0], dim=-1)[stream[t + 1]].item()
    return total, stream.numel() - 1


@pytest.mark.parametrize("cell", ["lstm", "lstm-gates"])
def test_test_perplexity_is_exp_mean_nll_of_the_one_token_loop(cell):
    task = fixture_task(dropout=0.3)
    model = build(task, cell).double()
    model.train()
    stream = task.corpus.test
    total, n = hand_nll(model, stream)
    model.train()
    metrics = task.evaluate(model, "test")
    assert model.training  # evaluate restores the mode
    assert metrics["tokens"] == n == stream.numel() - 1
    assert metrics["nll"] == pytest.approx(total / n, rel=1e-12)
    assert metrics["ppl"] == pytest.approx(math.exp(total / n), rel=1e-12)
    assert metrics["bpc"] == pytest.approx(total / n / math.log(2), rel=1e-12)
    assert (metrics["eval_batch_size"], metrics["eval_num_steps"]) == (1, 1)
    # any chunk length gives the one-token-at-a-time numbers
    model.eval()
    for chunk in (1, 2, 5, 13, 1000):
        assert sequential_nll(model, stream, chunk) == (pytest.approx(total, rel=1e-12), n)


def test_valid_uses_the_training_batch_shape_with_carried_state():
    task = fixture_task(batch_size=2, num_steps=2)
    model = build(task, "lstm-srnn").double().eval()
    valid = task.corpus.valid  # 11 tokens: 2 rows of 5, (5 - 1) // 2 = 2 windows
    rows = valid[:10].view(2, 5)
    with torch.no_grad():
        logits, _ = model(rows[:, :4])  # the two windows in one pass = state carried
        expected = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               rows[:, 1:5].reshape(-1), reduction="sum").item()
    metrics = task.evaluate(model, "valid")
    assert metrics["tokens"] == 8
    assert metrics["nll"] == pytest.approx(expected / 8, rel=1e-12)
    assert (metrics["eval_batch_size"], metrics["eval_num_steps"]) == (2, 2)
    assert stream_nll(model, valid, 2, 2) == (pytest.approx(expected, rel=1e-12), 8)


def test_char_level_reports_bits_per_character():
    task = fixture_task(level="char", batch_size=2, num_steps=5)
    assert task.corpus.level == "char"
    model = build(task, "lstm")
    m = task.evaluate(model, "valid")
    assert m["bpc"] == pytest.approx(m["nll"] / math.log(2))
    assert m["ppl"] == pytest.approx(2 ** m["bpc"])


# ----------------------------------------------------------------------------- model


@pytest.mark.parametrize("cell", PAPER_CELLS)
def test_every_parameter_uniform_within_init_scale(cell):
    task = fixture_task(hidden_size=16, init_scale=0.05)
    model = build(task, cell)
    names = {n for n, _ in model.named_parameters()}
    assert {"embedding.weight", "decoder.weight", "decoder.bias"} <= names
    for name, p in model.named_parameters():
        # torch's defaults (N(0,1) embedding, ±1/sqrt(16) = ±0.25 linear) would fail this
        assert p.abs().max() <= 0.05, name
        if p.numel() >= 16:
            assert p.abs().max() > 0.03, name  # really spread over the range


def test_dropout_on_embedding_between_layers_and_top_output_only():
    task = fixture_task(dropout=0.5)
    model = build(task, "lstm")
    assert model.encoder.dropout == 0.5 and model.encoder.recurrent_dropout == 0.0
    x = task.train_plan(0, torch.Generator())[0][0]
    model.train()
    torch.manual_seed(7)
    logits, _ = model(x)
    torch.manual_seed(7)  # the same masks, drawn in the same order, written out
    emb = nn.functional.dropout(model.embedding(x), 0.5, True)
    out, _ = model.encoder(emb)  # drops between its layers
    expected = model.decoder(nn.functional.dropout(out, 0.5, True))
    assert torch.allclose(logits, expected)
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])


@pytest.mark.parametrize("cell", ["lstm", "lstm-srnn"])
def test_a_few_sgd_epochs_lower_the_loss(cell):
    # init 0.3: at the tutorial's 0.1 a model this small first sits at the unigram
    # entropy (about 2.6 nats) for a few hundred steps
    task = fixture_task(batch_size=2, num_steps=4, hidden_size=32, init_scale=0.3)
    model = build(task, cell, seed=3)
    from lstmablate.config import TrainConfig

    cfg = TrainConfig(optimizer="sgd", lr=1.0, clip_norm=5.0)
    opt = build_optimizer(cfg, model.parameters())
    before = task.evaluate(model, "train")["nll"]
    model.train()
    for epoch in range(10):
        carry = task.init_carry(model)
        for batch in task.train_plan(epoch, torch.Generator()):
            opt.zero_grad()
            out = task.loss(model, batch, carry)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            carry = out.carry
    after = task.evaluate(model, "train")["nll"]
    assert before == pytest.approx(math.log(17), abs=0.1)  # near-uniform at init
    assert after < before - 1.0, after


def test_visualization_inputs_are_the_encoder_and_embedded_words():
    task = fixture_task()
    model = build(task, "lstm")
    enc, emb, tokens = task.visualization_inputs(model, "the zebra sat")
    assert enc is model.encoder and tokens == ["the", "<unk>", "sat"]
    ids = torch.tensor([[task.corpus.stoi[t] for t in tokens]])
    assert torch.equal(emb, model.embedding(ids))


# ----------------------------------------------------------------------------- data checks


def test_vocab_size_mismatch_names_the_file():
    task = PTBTask(PTBData(vocab_size=10000, verify=False), PTBModel(), FIXTURES)
    with pytest.raises(DataError, match=r"ptb\.train\.txt under .* gives a vocabulary of 17 word types"):
        task.use_artefacts(task.build_artefacts())


def test_checksums_reject_a_corrupted_file(tmp_path):
    real_data_dir = _real_dir()
    src = P.find_file(real_data_dir, "ptb/ptb.train.txt")
    (tmp_path / "ptb").mkdir()
    for split in ("valid", "test"):
        f = P.find_file(real_data_dir, f"ptb/ptb.{split}.txt")
        shutil.copy(f, tmp_path / "ptb" / f.name)
    raw = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
    bad = tmp_path / "ptb" / "ptb.train.txt"
    bad.write_bytes(raw.replace(b" the ", b" teh ", 1))  # one word changed
    task = PTBTask(PTBData(), PTBModel(), tmp_path)
    with pytest.raises(DataError) as exc:
        task.check_data()
    msg = str(exc.value)
    assert f"checksum mismatch for {bad}" in msg
    assert "ptb.valid.txt" not in msg and "ptb.test.txt" not in msg
    with pytest.raises(DataError, match=f"checksum mismatch for {bad}"):
        task.build_artefacts()
    # the intact originals pass
    lines = PTBTask(PTBData(), PTBModel(), real_data_dir).check_data()
    assert len(lines) == 3 and all("sha256 ok" in line for line in lines)


# ----------------------------------------------------------------------------- real PTB


@pytest.fixture(scope="module")
def real_task() -> PTBTask:
    cfg = resolve_config(PTBTask, "lstm-srnn", recipe="ptb-small")
    task = PTBTask(cfg.data, cfg.model, _real_dir())
    task.use_artefacts(task.build_artefacts())
    task.setup()
    return task


def test_real_ptb_matches_the_tutorial(real_task):
    c = real_task.corpus
    assert c.vocab_size == 10000 and c.vocab[0] == "the" and "<eos>" in c.stoi
    assert (c.train.numel(), c.valid.numel(), c.test.numel()) == (929589, 73760, 82430)
    assert len(real_task.train_plan(0, torch.Generator())) == 2323  # the tutorial's small epoch_size
    medium = PTBTask(PTBData(num_steps=35), PTBModel(), real_task.data_dir)
    medium.corpus = c
    assert len(medium.train_plan(0, torch.Generator())) == 1327


def test_real_test_split_slice_is_evaluated_with_batch_1(real_task):
    model = build(real_task, "lstm-srnn")
    full = real_task.corpus.test
    try:
        real_task.corpus.test = full[:1500]
        m = real_task.evaluate(model, "test")
    finally:
        real_task.corpus.test = full
    assert m["tokens"] == 1499 and m["eval_batch_size"] == 1
    assert 5000 < m["ppl"] < 20000  # untrained at init 0.1: about the vocabulary size


def test_cli_train_ptb_small_shortened(tmp_path):
    data_dir = _real_dir()
    r = subprocess.run(
        [sys.executable, "-m", "lstmablate", "train", "--task", "ptb", "--cell", "lstm-srnn",
         "--recipe", "ptb-small", "--set", "train.max_steps=5", "--set", "train.eval_test=false",
         "--out", str(tmp_path / "runs"), "--data-dir", str(data_dir), "--threads", "1"],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    files = RunFiles.of(tmp_path / "runs", "ptb-small", "lstm-srnn", 1)
    result = json.loads(files.result.read_text())
    assert result["primary"] == "ppl" and result["steps"] == 5 and result["shortened"]
    dev = result["best"]["dev"]  # the selected checkpoint's dev metrics
    assert dev["tokens"] == 73600 and dev["eval_batch_size"] == 20 and dev["eval_num_steps"] == 20
    assert 100 < dev["ppl"] < 10000 and math.isfinite(dev["nll"])
    # the log: the training loss per token (the scale of the dev NLL, not 20 steps' sum),
    # word-level bits labelled per word, integers as integers
    log = " ".join(r.stderr.split())
    train_loss = float(log.split("train loss ")[1].split()[0])
    assert abs(train_loss - dev["nll"]) < 1.0, log  # after 5 steps both are near log(10000)
    assert "bits/word" in log and "bpc" not in log and "tokens 73600 " in log
    # the eval table: one row per metric, piped as TSV (metric, value, meaning)
    run = tmp_path / "runs" / "ptb-small" / "lstm-srnn" / "seed-1"
    r = subprocess.run([sys.executable, "-m", "lstmablate", "eval", str(run), "--split", "dev",
                        "--data-dir", str(data_dir), "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in r.stdout.splitlines()[1:]}
    assert rows["tokens"][1] == "73600" and rows["eval_batch_size"][1] == "20"
    assert rows["bits/word"][2].startswith("bits per word")
    assert float(rows["ppl"][1]) == pytest.approx(dev["ppl"], abs=0.005)


# ----------------------------------------------------------------------------- recipes


@pytest.mark.parametrize("name, hidden, steps, init, clip, dropout, decay, start, epochs", [
    ("ptb-small", 200, 20, 0.1, 5, 0.0, 0.5, 4, 13),
    ("ptb-medium", 650, 35, 0.05, 5, 0.5, 0.8, 6, 39),
    ("ptb-large", 1500, 35, 0.04, 10, 0.65, 1 / 1.15, 14, 55),
])
def test_recipes_are_the_tutorial_configs(name, hidden, steps, init, clip, dropout, decay,
                                          start, epochs):
    cfg = resolve_config(PTBTask, "lstm", recipe=name)
    d, m, t = cfg.data, cfg.model, cfg.train
    assert (d.level, d.batch_size, d.num_steps, d.vocab_size) == ("word", 20, steps, 10000)
    assert (m.hidden_size, m.num_layers, m.init_scale, m.dropout) == (hidden, 2, init, dropout)
    assert (t.optimizer, t.lr, t.schedule, t.clip_norm, t.max_epochs) == \
        ("sgd", 1.0, "epoch_decay", clip, epochs)
    assert t.decay == pytest.approx(decay, rel=1e-12) and t.decay_start == start
    # TF: lr = 1.0 * lr_decay ** max(i + 1 - max_epoch, 0) for 0-based epoch i
    sched = Schedule(t, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0))
    for i in range(epochs):
        assert sched.lr_at(i, 0) == pytest.approx(decay ** max(i + 1 - start, 0))
    _, recipe = load_recipe(name)
    assert recipe["cells"] == PAPER_CELLS
    assert recipe["reference"]["lstm"]["ppl"] > 0


def test_table1_references():
    _, medium = load_recipe("ptb-medium")
    _, large = load_recipe("ptb-large")
    assert {c: r["ppl"] for c, r in medium["reference"].items()} == {
        "lstm": 83.9, "lstm-srnn": 80.5, "lstm-srnn-out": 81.6, "lstm-srnn-hidden": 83.3,
        "lstm-gates": 140.9}
    assert {c: r["ppl"] for c, r in large["reference"].items()} == {
        "lstm": 78.8, "lstm-srnn": 76.0, "lstm-srnn-out": 78.5, "lstm-srnn-hidden": 82.9,
        "lstm-gates": 126.1}
    # the paper's effort: 5 LSTM seeds, one run per ablation
    for cfg in (medium, large):
        assert recipe_seeds(cfg, "lstm") == [1, 2, 3, 4, 5]
        assert recipe_seeds(cfg, "lstm-srnn") == [1]
    assert "82.07" in medium["reference_source"] and "78.29" in large["reference_source"]
    _, table1 = load_recipe("table1")  # a table spec over the two recipes
    assert "task" not in table1 and "47.5" in table1["reference_source"]  # draft's Billion Word
    spec = table1["table"]
    assert spec["experiments"] == ["ptb-medium", "ptb-large"]
    assert spec["cells"] == PAPER_CELLS and spec["metrics"] == ["ppl"]


# ----------------------------------------------------------------------------- contracts


def test_eval_reads_only_its_split_with_the_saved_vocabulary(tmp_path):
    """With the run's vocabulary (its artefact), evaluation needs no training file."""
    task = fixture_task()
    art = task.build_artefacts()
    assert art["vocab"] == task.corpus.vocab
    (tmp_path / "ptb").mkdir()
    shutil.copy(FIXTURES / "ptb" / "ptb.test.txt", tmp_path / "ptb" / "ptb.test.txt")
    only_test = PTBTask(task.data_cfg, task.model_cfg, tmp_path)
    only_test.use_artefacts(art)
    only_test.setup(["test"])  # no ptb.train.txt here: it is not read
    assert torch.equal(only_test.corpus.test, task.corpus.test)
    model = build(task, "lstm")
    assert only_test.evaluate(model, "test") == task.evaluate(model, "test")
    with pytest.raises(DataError, match="ptb.train.txt not found"):
        only_test.build_artefacts()


@pytest.mark.parametrize("split", ["test", "valid"])
def test_predictions_file_holds_every_scored_token(tmp_path, split):
    task = fixture_task(batch_size=2, num_steps=2)
    model = build(task, "lstm-srnn").double().eval()
    path = tmp_path / "preds.tsv"
    from_file = task.write_predictions(model, split, path)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# lstmablate ptb predictions") and lines[1] == "position\ttoken\tlogprob"
    rows = [line.split("\t") for line in lines[2:]]
    stream = task.corpus.split(split)
    # every row names the token at its position, and its log-probability is the model's
    for pos, tok, _ in rows:
        assert task.corpus.vocab[int(stream[int(pos)])] == tok
    if split == "test":
        assert [int(r[0]) for r in rows] == list(range(1, stream.numel()))
        total, n = hand_nll(model, stream)
        assert -sum(float(r[2]) for r in rows) == pytest.approx(total, rel=1e-12)
    expected = task.evaluate(model, split)
    assert from_file.keys() == expected.keys()
    for k in expected:
        assert from_file[k] == pytest.approx(expected[k], rel=1e-12), k
    assert read_predictions(path) == from_file


@pytest.mark.parametrize("level, split", [("word", "test"), ("word", "valid"), ("char", "test")])
def test_per_sentence_scores_recompute_the_perplexity(level, split, tmp_path):
    """scores/<split>.jsonl round trip: each line's summed NLL and predicted tokens give the
    split's ppl, nll and bpc; the tokens per line are the protocol's (test: every token but the
    stream's first; valid: the tail that fills no window dropped)."""
    task = fixture_task(level=level, batch_size=2, num_steps=2)
    model = build(task, "lstm-srnn").double().eval()
    metrics, records = assert_round_trip(task, model, split, tmp_path)
    stream = task.corpus.split(split)
    lines = P.sentence_spans(stream, task.corpus.eos_id)
    assert len(records) == len(lines)
    assert sum(r["tokens"] for r in records) == metrics["tokens"]
    if split == "test":  # a line predicts all its tokens, the first line all but its first
        assert [r["tokens"] for r in records] == [e - s - (i == 0) for i, (s, e) in enumerate(lines)]
        total, _ = hand_nll(model, stream)
        first = lines[0][1] - 1  # the first line's last position
        ended = -float(sequential_logprobs(model, stream[:first + 1], 5)[1].sum())
        assert records[0]["nll"] == pytest.approx(ended, rel=1e-12)  # the state carries on
        assert sum(r["nll"] for r in records) == pytest.approx(total, rel=1e-12)
    else:
        assert metrics["tokens"] < stream.numel() - 1


def test_per_sentence_scores_of_the_sentence_protocol(tmp_path):
    """Sentence mode: every line scored alone, its tokens and <eos> predicted."""
    task = PTBTask(PTBData(batch_size=2, sentences=True, verify=False),
                   PTBModel(hidden_size=8, num_layers=2, dropout=0.0, init_scale=0.1), FIXTURES)
    task.use_artefacts(task.build_artefacts())
    task.setup()
    model = build(task, "lstm").double().eval()
    metrics, records = assert_round_trip(task, model, "test", tmp_path)
    lines = P.sentence_spans(task.corpus.test, task.corpus.eos_id)
    assert [r["tokens"] for r in records] == [e - s for s, e in lines]
    assert metrics["sentences"] == len(records)


def test_eval_chunk_changes_no_metric():
    task = fixture_task()
    model = build(task, "gru").double()
    base = task.evaluate(model, "test")
    for chunk in (1, 7):
        task.eval_cfg = PTBEval(chunk=chunk)
        m = task.evaluate(model, "test")
        assert m.keys() == base.keys()
        assert all(m[k] == pytest.approx(base[k], rel=1e-12) for k in m)
