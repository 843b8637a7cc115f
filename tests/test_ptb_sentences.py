"""PTB as sentences (the second-order report's protocol, Renganathan & Singh, 004 §5.3 / §6.1):
padded sentence batches score each sentence exactly as alone, the cut at N characters, the
loss and metrics per token, the data order fixed by the seed, the report's model options,
and the parameter count of every ``secondorder-*`` recipe against the report's budget."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

from tolerance import rel_tol

from lstmablate.batching import BatchPlan, pooled_batches
from lstmablate.cells import build_encoder
from lstmablate.recipes import available_recipes, load_recipe, resolve_config
from lstmablate.errors import ConfigError
from lstmablate.run.sweep import plan_sweep
from lstmablate.train.position import data_generator
from lstmablate_tasks.ptb import data as P
from lstmablate_tasks.ptb.evaluate import read_predictions, sentence_logprobs
from lstmablate_tasks.ptb.params import recipe_parameter_counts
from lstmablate_tasks.ptb.task import PTBData, PTBEval, PTBModel, PTBTask

TRAIN = [" the cat sat on the mat ", " a dog ran ", " the dog sat on a <unk> near the cat ",
         " mr. <unk> ran to the mat ", " a cat "]
VALID = [" the cat ran ", " a dog sat on the mat "]
TEST = [" the dog sat on the cat near the mat ", " mr. <unk> ran "]


@pytest.fixture
def ptb_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ptb"
    d.mkdir()
    for split, lines in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        (d / f"ptb.{split}.txt").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def make_task(data_dir: Path, level: str = "word", cell: str = "lstm", batch_size: int = 2,
              max_chars: int = 0, eval_batch: int = 0, length_pool: int = 0, **model):
    model = {"hidden_size": 8, "num_layers": 2, "embedding_size": 6, "dropout": 0.25,
             "dropout_scope": "softmax", "init": "pytorch", **model}
    task = PTBTask(PTBData(level=level, batch_size=batch_size, sentences=True, max_chars=max_chars,
                           length_pool=length_pool, verify=False), PTBModel(**model), data_dir,
                   eval_cfg=PTBEval(batch_size=eval_batch))
    task.use_artefacts(task.build_artefacts())
    task.setup()
    torch.manual_seed(0)
    return task, task.build_model(functools.partial(build_encoder, cell))


# -- encoding and cutting -------------------------------------------------------------------------
def test_a_sentence_is_eos_then_its_tokens_predicting_its_tokens_then_eos(ptb_dir):
    task, _ = make_task(ptb_dir)
    s = task.sentences["valid"]
    voc = task.corpus.vocab
    x, y = s.example(0)
    assert [voc[i] for i in x] == ["<eos>", "the", "cat", "ran"]
    assert [voc[i] for i in y] == ["the", "cat", "ran", "<eos>"]
    # every token of the split's stream is a target exactly once (the stream's count)
    pos = torch.cat([s.positions(i) for i in range(len(s))])
    assert pos.tolist() == list(range(task.corpus.valid.numel()))
    assert s.num_targets == task.corpus.valid.numel() and all(s.complete)


@pytest.mark.parametrize("n", [1, 3, 9, 10, 11, 40])
def test_char_cut_keeps_the_first_n_characters_and_eos_only_when_whole(ptb_dir, n):
    task, _ = make_task(ptb_dir, level="char", max_chars=n)
    train, voc = task.sentences["train"], task.corpus.vocab
    assert len(train) == len(TRAIN)  # no sentence is lost
    for i, line in enumerate(TRAIN):
        chars = list("_".join(line.split()))  # "_" is the whitespace: one character
        x, y = train.example(i)
        got = [voc[t] for t in y]
        if len(chars) <= n:  # fits: kept whole, and its end is predicted
            assert got == chars + ["<eos>"] and train.complete[i]
        else:  # cut: exactly n characters (whole ones), no <eos> target
            assert got == chars[:n] and not train.complete[i]
            assert "<eos>" not in got
        assert [voc[t] for t in x] == ["<eos>"] + got[:-1]
    # " a cat " is "a_cat", 5 characters: whole at 5, cut at 4
    assert P.cut_length(list("a_cat"), 5, "char") == 5 and P.cut_length(list("a_cat"), 4, "char") == 4
    # valid and test are never cut
    assert all(task.sentences["valid"].complete) and all(task.sentences["test"].complete)
    assert task.sentences["test"].num_targets == task.corpus.test.numel()


def test_word_cut_keeps_whole_words_within_n_characters(ptb_dir):
    words = ["the", "cat", "sat", "on", "the", "mat"]  # "the cat sat on the mat": 22 chars
    assert [P.cut_length(words, n, "word") for n in (2, 3, 6, 7, 11, 21, 22, 100)] == \
        [0, 1, 1, 2, 3, 5, 6, 6]
    task, _ = make_task(ptb_dir, max_chars=9)
    train, voc = task.sentences["train"], task.corpus.vocab
    assert [voc[t] for t in train.example(0)[1]] == ["the", "cat"]  # "the cat sat" is 11
    assert [voc[t] for t in train.example(1)[1]] == ["a", "dog", "ran", "<eos>"]  # 9: whole
    assert [train.complete[i] for i in range(len(TRAIN))] == [False, True, False, False, True]
    # a first word longer than N leaves nothing: that sentence is dropped from training
    task, _ = make_task(ptb_dir, max_chars=1)
    assert len(task.sentences["train"]) == 2  # only " a dog ran " and " a cat " start with "a"


def test_max_chars_needs_sentences_and_a_clear_error_when_nothing_is_left(ptb_dir):
    with pytest.raises(ConfigError, match="data.sentences=true"):
        PTBData(max_chars=25).validate()
    with pytest.raises(ConfigError, match="max_chars must be >= 0"):
        PTBData(sentences=True, max_chars=-1).validate()
    for split in ("train", "valid", "test"):
        (ptb_dir / "ptb" / f"ptb.{split}.txt").write_text(" mr. <unk> \n")
    with pytest.raises(ConfigError, match="no training sentence is left.*max_chars=2"):
        make_task(ptb_dir, max_chars=2)
    with pytest.raises(ConfigError, match="dropout_scope"):
        PTBModel(dropout_scope="inputs").validate()
    with pytest.raises(ConfigError, match="model.init"):
        PTBModel(init="xavier").validate()


def test_stream_must_end_with_eos():
    with pytest.raises(ValueError, match="end with <eos>"):
        P.sentence_spans(torch.tensor([3, 0, 4]), eos_id=0)
    assert P.sentence_spans(torch.tensor([3, 0, 4, 5, 0]), eos_id=0) == [(0, 2), (2, 5)]


# -- batching with masks == each sentence alone ---------------------------------------------------
@pytest.mark.parametrize("cell", ["lstm", "mmlstm", "lstm-gates", "mrnn"])
@pytest.mark.parametrize("level", ["word", "char"])
def test_padded_batches_score_each_sentence_exactly_as_alone(ptb_dir, cell, level):
    task, model = make_task(ptb_dir, level=level, cell=cell, num_layers=2)
    model.eval()
    s = task.sentences["test"]
    alone = []
    for i in range(len(s)):
        x, y = s.example(i)
        with torch.no_grad():
            logits, _ = model(x.unsqueeze(0))
        alone.append(torch.log_softmax(logits[0].double(), -1).gather(1, y.unsqueeze(1)).squeeze(1))
    pos, lp = sentence_logprobs(model, s, batch_size=len(s))  # one padded batch
    assert pos.tolist() == list(range(s.num_targets))
    torch.testing.assert_close(lp, torch.cat(alone), rtol=1e-5, atol=1e-6)
    # any batch size gives the same numbers; the training loss is the mean over real tokens
    _, lp1 = sentence_logprobs(model, s, batch_size=1)
    torch.testing.assert_close(lp, lp1, rtol=1e-5, atol=1e-6)
    batch = s.collate(range(len(s)))
    out = task.loss(model, batch, None)
    assert out.weight == s.num_targets and out.carry is None
    assert math.isclose(out.loss.item(), -float(torch.cat(alone).mean()), rel_tol=1e-5)


def test_padding_never_changes_a_real_tokens_loss_or_gradient(ptb_dir):
    """Garbage in the padded positions (any input id) changes nothing."""
    task, model = make_task(ptb_dir, cell="mmlstm")
    model.eval()
    x, y, lengths = task.sentences["train"].collate([0, 1, 4])
    pad = y == P.PAD_TARGET
    assert pad.any() and (x[pad] == 0).all()
    grads = []
    for fill in (0, 5):
        model.zero_grad()
        out = task.loss(model, (x.masked_fill(pad, fill), y, lengths), None)
        out.loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        grads[-1].append(out.loss.detach())
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# -- training plan, metrics, predictions ----------------------------------------------------------
def test_the_seed_fixes_the_sentence_order_and_every_sentence_is_in_each_epoch(ptb_dir):
    task, _ = make_task(ptb_dir, batch_size=2)
    plan = task.train_plan(1, data_generator(1, 1))
    assert isinstance(plan, BatchPlan) and len(plan) == 3  # 5 sentences: 2 + 2 + 1
    assert sorted(i for g in plan.groups for i in g) == list(range(len(TRAIN)))
    again = task.train_plan(1, data_generator(1, 1))
    assert plan.groups == again.groups
    for a, b in zip(plan[0], again[0]):
        assert torch.equal(a, b)
    orders = {tuple(i for g in task.train_plan(e, data_generator(s, e)).groups for i in g)
              for s in (1, 2) for e in (1, 2, 3)}
    assert len(orders) > 1  # seeds and epochs shuffle


def test_length_pools_bucket_the_same_sentences_by_length(ptb_dir):
    """data.length_pool: every training sentence once per epoch, in torchtext's pool order
    (pooled_batches over the sentence lengths), fixed by the seed, shorter padded batches."""
    lines = TRAIN + [" " + " ".join(["the"] * n) + " " for n in (1, 9, 2, 8, 3, 7, 4)]
    (ptb_dir / "ptb" / "ptb.train.txt").write_text("".join(f"{line}\n" for line in lines))
    task, _ = make_task(ptb_dir, batch_size=3, length_pool=2)
    train = task.sentences["train"]
    plan = task.train_plan(2, data_generator(1, 2))
    assert plan.groups == pooled_batches(train.lengths, 3, data_generator(1, 2), 2)
    assert sorted(i for g in plan.groups for i in g) == list(range(len(lines)))
    assert plan.groups == task.train_plan(2, data_generator(1, 2)).groups
    assert plan.groups != task.train_plan(3, data_generator(1, 3)).groups
    padded = lambda p: sum(p[i][0].numel() for i in range(len(p)))  # noqa: E731
    plain, _ = make_task(ptb_dir, batch_size=3)
    random_plans = [plain.train_plan(e, data_generator(1, e)) for e in range(1, 6)]
    pooled_plans = [task.train_plan(e, data_generator(1, e)) for e in range(1, 6)]
    assert sum(map(padded, pooled_plans)) < sum(map(padded, random_plans))
    x, y, lengths = plan[0]  # a pooled batch is an ordinary padded batch of its sentences
    assert torch.equal(x, train.collate(plan.groups[0])[0]) and lengths.tolist() == [
        train.lengths[i] for i in plan.groups[0]]
    with pytest.raises(ConfigError, match="length_pool must be >= 0"):
        PTBData(sentences=True, length_pool=-1).validate()
    with pytest.raises(ConfigError, match="needs data.sentences=true"):
        PTBData(length_pool=100).validate()


def test_metrics_are_totals_over_tokens_and_predictions_agree(ptb_dir, tmp_path):
    task, model = make_task(ptb_dir, level="char", eval_batch=1)
    m = task.evaluate(model, "test")
    _, lp = sentence_logprobs(model.eval(), task.sentences["test"], 3)
    nll = -float(lp.sum()) / lp.numel()
    assert m["tokens"] == task.corpus.test.numel() == lp.numel()
    assert m["sentences"] == len(TEST) and m["eval_num_steps"] == 0 and m["eval_batch_size"] == 1
    # the task scores at batch 1, the reference at batch 3: two float32 evaluations of the
    # model, equal to float32 rounding (a mean of same-sign terms keeps their relative error)
    assert math.isclose(m["nll"], nll, rel_tol=rel_tol(torch.float32))
    assert math.isclose(m["bpc"], m["nll"] / math.log(2), rel_tol=1e-12)  # float64 from here on
    assert math.isclose(m["ppl"], 2 ** m["bpc"], rel_tol=1e-12)
    got = task.write_predictions(model, "test", tmp_path / "pred.tsv")
    assert got["sentences"] == len(TEST)
    # the same evaluation, summed once by torch and once from the file's 17-digit values
    assert math.isclose(got["nll"], m["nll"], rel_tol=rel_tol(torch.float64))
    assert read_predictions(tmp_path / "pred.tsv")["tokens"] == m["tokens"]


def test_dropout_only_before_the_softmax_and_embedding_size(ptb_dir):
    task, model = make_task(ptb_dir, num_layers=2, dropout=0.5)
    assert model.embedding.embedding_dim == 6 and model.encoder.input_size == 6
    assert model.encoder.dropout == 0.0  # not between layers
    model.train()
    x, _, lengths = task.sentences["test"].collate([0, 1])
    torch.manual_seed(1)
    emb = model.embedding(x)
    out, _ = model.encoder(emb, lengths)  # no dropout inside: deterministic in train mode
    out2, _ = model.encoder(model.embedding(x), lengths)
    assert torch.equal(out, out2)
    logits_a, _ = model(x, None, lengths)
    logits_b, _ = model(x, None, lengths)
    assert not torch.equal(logits_a, logits_b)  # the dropout before the softmax


def test_a_few_adam_steps_lower_the_sentence_loss(ptb_dir):
    task, model = make_task(ptb_dir, level="char", hidden_size=32, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = task.evaluate(model, "train")["nll"]
    for epoch in range(1, 16):
        for batch in task.train_plan(epoch, data_generator(1, epoch)):
            opt.zero_grad()
            task.loss(model, batch, None).loss.backward()
            opt.step()
    assert task.evaluate(model, "train")["nll"] < before - 0.5


def test_the_stream_mode_is_unchanged_by_default():
    d = PTBData()
    assert (d.sentences, d.max_chars, d.length_pool) == (False, 0, 0)
    m = PTBModel()
    assert (m.embedding_size, m.dropout_scope, m.init) == (0, "all", "uniform")


def test_real_ptb_sentences_count_every_token(real_data_dir):
    if not (real_data_dir / "ptb").exists():
        pytest.skip(f"real PTB not found under {real_data_dir}")
    corpus = P.load_corpus(real_data_dir, level="char", splits=("test",),
                           vocab=P.read_vocab(real_data_dir, "char"))
    s = P.Sentences(corpus.test, corpus.eos_id)
    assert len(s) == 3761 and s.num_targets == corpus.test.numel()
    cut = P.Sentences(corpus.test, corpus.eos_id, corpus.vocab, "char", max_chars=25)
    assert sum(not c for c in cut.complete) == 3614  # test lines longer than 25 characters
    assert max(cut.lengths) == 26  # 25 characters, or fewer plus <eos>


# -- the recipes: the report's sizes and parameter budgets ----------------------------------------
#: 004 Table 2: "4.5M" (char) and "2M" (word) parameters; the CPU stand-ins of the char models
#: are matched to 1/30 of 4.5M (0.15M). The report gives the budgets to two (4.5M) and one (2M)
#: significant figures; its own sizes land within 0.6% of them with our parameterisation
#: (embedding, untied softmax with bias, the cells' equations), so 1% is the tolerance.
BUDGETS = {"char": 4_500_000, "word": 2_000_000}
CPU_CHAR_BUDGET = 150_000
TOLERANCE = 0.01
#: where the report's count cannot be matched at its printed size h = m: our mRNN / mLSTM
#: follow the original papers (two factor matrices W_mh, W_hm), the report's counts fit one
#: factor matrix fewer (docs/secondorder-lm.md); (cell, layers) -> our count at the report's size
KNOWN_MISMATCH = {("mrnn", 1): 8_389_422, ("mlstm", 1): 5_457_133}
TABLE1_SIZES = {  # 004 Table 1
    ("char", "lstm-gates", 1): 2032, ("char", "lstm-gates", 2): 1194, ("char", "lstm", 1): 991,
    ("char", "lstm", 2): 589, ("char", "mrnn", 1): 1972, ("char", "mlstm", 1): 977,
    ("char", "mmrnn", 1): 1038, ("char", "mmrnn", 2): 696, ("char", "mmlstm", 1): 512,
    ("char", "mmlstm", 2): 345, ("word", "lstm-gates", 1): 133, ("word", "lstm", 1): 125,
    ("word", "lstm", 2): 115, ("word", "mmrnn", 1): 128, ("word", "mmlstm", 1): 112,
    ("word", "mmlstm", 2): 97,
}


def secondorder_recipes() -> list[str]:
    """The second-order report's training recipes (not its table specs)."""
    return [n for n in available_recipes() if n.startswith("secondorder-") and "task" in load_recipe(n)[1]]


def test_there_is_a_cpu_stand_in_for_every_paper_scale_recipe():
    names = set(secondorder_recipes()) - {"secondorder-char-1layer-matched"}  # ours, see below
    paper = {n for n in names if not n.endswith("-cpu")}
    assert len(paper) == 10 and {n + "-cpu" for n in paper} == names - paper
    for name in names - paper:
        _, r = load_recipe(name)
        assert "STAND-IN" in r["description"]


@pytest.mark.parametrize("name", sorted(n for n in secondorder_recipes()))
def test_every_recipe_is_the_reports_protocol_at_its_budget(name):
    _, r = load_recipe(name)
    cpu = name.endswith("-cpu")
    for cell in r["cells"]:
        cfg = resolve_config(PTBTask, cell, recipe=name)
        d, m, t = cfg.data, cfg.model, cfg.train
        assert d.sentences and d.batch_size == 128
        assert (t.optimizer, t.lr, t.clip_norm, t.patience, t.schedule) == ("adam", 0.001, 3.5, 5, "constant")
        assert t.max_epochs == (200 if not cpu else 2 if d.level == "word" else 20)
        assert (m.dropout, m.dropout_scope) == (0.25, "softmax")
        assert m.embedding_size == (128 if d.level == "char" else 64)
        if name.endswith("-matched"):  # ours: mrnn/mlstm resized to the budget (checked below)
            assert d.level == "char" and cell in ("mrnn", "mlstm")
        elif not cpu or d.level == "word":
            assert m.hidden_size == TABLE1_SIZES[(d.level, cell, m.num_layers)]
        if "cut" in name:
            assert d.max_chars == int(name.split("cut")[1].split("-")[0])
        # pooled batches (ours), except in the two word stand-ins measured before the option
        assert d.length_pool == (0 if name in ("secondorder-word-1layer-cpu",
                                               "secondorder-word-2layer-cpu") else 100)
    for experiment, cell, h, layers, n in recipe_parameter_counts(name):
        level = resolve_config(PTBTask, cell, recipe=name).data.level
        budget = CPU_CHAR_BUDGET if cpu and level == "char" else BUDGETS[level]
        if not cpu and (cell, layers) in KNOWN_MISMATCH and level == "char" and "matched" not in experiment:
            assert n == KNOWN_MISMATCH[(cell, layers)], (experiment, cell, n)
            continue
        assert abs(n - budget) <= TOLERANCE * budget, (experiment, cell, h, layers, n, budget)


def test_table_specs_list_their_runs(tmp_path):
    t2 = plan_sweep("secondorder-table2", tmp_path)
    assert len(t2) == 6 + 4 + 4 + 2
    assert {it.experiment for it in t2} == {"secondorder-char-1layer", "secondorder-char-2layer",
                                            "secondorder-word-1layer", "secondorder-word-2layer"}
    t3 = plan_sweep("secondorder-table3-cpu", tmp_path)
    assert len(t3) == 12 and {it.cell for it in t3} == {"lstm", "mmlstm"}
    char = plan_sweep("secondorder-table2-char", tmp_path)
    assert {(it.experiment, it.cell) for it in char if "matched" in it.experiment} == {
        ("secondorder-char-1layer-matched", "mrnn"), ("secondorder-char-1layer-matched", "mlstm")}
    _, r = load_recipe("secondorder-cut50-2layer")
    assert r["reference"] == {"lstm": {"bpc": 1.416}, "mmlstm": {"bpc": 1.411}}
    _, r = load_recipe("secondorder-word-1layer")
    assert r["reference"]["mmlstm"] == {"nll": 4.794}
