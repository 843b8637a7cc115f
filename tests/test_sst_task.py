"""The ``sst`` task: the PTB-format tree reader (real treebank lines; malformed input named by
file, line and column), the SST-5 / SST-2 label settings, vocabulary and pretrained vectors,
an overfit run through the trainer, every registered cell, predictions files, visualize.

``tests/fixtures/sst/{train,dev,test}.txt``: six invented sentences in the treebank's format
(the same six in every split, so an overfit model scores 100% on test)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.config import TrainConfig, update_dataclass
from lstmablate.errors import ConfigError, DataError, UserError
from lstmablate.run.runs import RunFiles
from lstmablate.train import Trainer
from lstmablate_tasks.sst import data as sst
from lstmablate_tasks.sst.task import SSTData, SSTEval, SSTModel, SSTTask
from lstmablate_tasks.sst.trees import parse_tree, read_trees

from item_scores_check import assert_round_trip

FIXTURES = Path(__file__).parent / "fixtures"  # the data directory: sst/{train,dev,test}.txt
SMALL = dict(embedding_size=12, hidden_size=10, mlp_hidden=8, dropout=0.0)


def make_task(data_dir=FIXTURES, splits=("train", "dev", "test"), classes=5, eval_cfg=None,
              train_phrases=False, **model) -> SSTTask:
    task = SSTTask(SSTData(classes=classes, train_phrases=train_phrases, verify=False),
                   SSTModel(**{**SMALL, **model}), data_dir, seed=1, eval_cfg=eval_cfg)
    task.use_artefacts(json.loads(json.dumps(task.build_artefacts())))  # as saved with a run
    task.setup(splits)
    return task


def train(task, model, run_dir, **overrides):
    cfg = update_dataclass(TrainConfig(), dict(SSTTask.train_defaults), "train", "defaults")
    cfg = update_dataclass(cfg, overrides, "train", "test")
    return Trainer(cfg, task, model, RunFiles(run_dir), seed=1, device=torch.device("cpu"),
                   identity={"task": "sst"}, progress=False).fit()


# -- the reader -------------------------------------------------------------------------------
def test_a_tree_gives_words_and_every_labelled_span():
    t = parse_tree("(3 (2 It) (4 (4 (2 works) (4 wonderfully)) (2 .)))")
    assert t.words == ("It", "works", "wonderfully", ".") and t.label == 3
    assert t.spans == ((0, 4, 3), (0, 1, 2), (1, 4, 4), (1, 3, 4), (1, 2, 2), (2, 3, 4),
                       (3, 4, 2))
    assert t.phrases()[2] == (("works", "wonderfully", "."), 4)


def test_real_treebank_files(real_data_dir):
    """The three files as released: sentence counts, the first training tree, root label
    counts, binary trees (2n - 1 nodes), and the one word that holds a non-breaking space."""
    sizes = {}
    for split in sst.SPLITS:
        trees = read_trees(sst.split_path(real_data_dir, split))  # checksums verified too
        sizes[split] = len(trees)
        assert all(len(t.spans) == 2 * len(t.words) - 1 for t in trees)
        assert all(t.spans[0][:2] == (0, len(t.words)) for t in trees)
        if split == "train":
            first, nbsp = trees[0], trees[4341]  # line 1 and line 4342
    assert sizes == {"train": 8544, "dev": 1101, "test": 2210}
    assert " ".join(first.words[:6]) == "The Rock is destined to be" and first.label == 3
    assert first.spans[1] == (0, 2, 2)  # (2 (2 The) (2 Rock))
    assert "8\u00a01\\/2" in nbsp.words
    train = read_trees(sst.split_path(real_data_dir, "train"))
    counts = [sum(t.label == k for t in train) for k in range(5)]
    assert counts == [1092, 2218, 1624, 2322, 1288]


MALFORMED = [
    ("(3 (2 a) (2 b)", None, "1 bracket still open at the end of the line"),
    ("(3 (2 a) (2 b)))", 16, "')' closes no open bracket"),
    ("(7 (2 a) (2 b))", 2, "'7' is not a sentiment label; expected 0-4"),
    ("(3 (x a) (2 b))", 5, "'x' is not a sentiment label"),
    ("(3 (2 a b))", 9, "the word 'b' after a word"),
    ("(3 (2 a) b)", 10, "the word 'b' after a subtree"),
    ("(3 (2 a) (2))", 12, "a node with a label but no word or subtree"),
    ("(3 (2 a) (2 b)) (2 c)", 17, "'(' after the tree's closing bracket"),
    ("3 (2 a)", 1, "'3' outside any bracket; expected '('"),
    ("(3 (2 a) (", None, "the line ends after '('"),
    ("(2 word (3 x))", 9, "a subtree after a word"),
    ("   ", None, "the line is empty"),
]


@pytest.mark.parametrize("line,column,what", MALFORMED)
def test_malformed_trees_name_file_line_and_column(tmp_path, line, column, what):
    good = "(3 (2 A) (3 (3 fine) (2 film)))\n"
    path = tmp_path / "train.txt.gz"
    path.write_bytes(gzip.compress((good + good + line + "\n" + good).encode()))
    with pytest.raises(DataError) as err:
        read_trees(path)
    msg = str(err.value)
    at = f"{path}, line 3" + (f", column {column}" if column else "")
    assert msg.startswith(at + ": malformed SST tree: " + what), msg


def test_cli_reports_a_malformed_treebank_without_a_traceback(tmp_path):
    data = tmp_path / "data" / "sst"
    data.mkdir(parents=True)
    for split in sst.SPLITS:
        (data / f"{split}.txt").write_text((FIXTURES / "sst" / f"{split}.txt").read_text())
    with open(data / "train.txt", "a") as f:
        f.write("(3 (2 a) (9 b))\n")
    r = subprocess.run([sys.executable, "-m", "lstmablate", "train", "--task", "sst", "--cell",
                        "lstm", "--data-dir", "data", "--set", "data.verify=false", "--threads",
                        "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    text = "".join(r.stderr.split())  # the console wraps lines anywhere
    assert "train.txt,line7,column11:malformedSSTtree:'9'isnotasentimentlabel" in text
    assert not (tmp_path / "runs").exists()  # nothing was written


# -- label settings, vocabulary, batches --------------------------------------------------------
def test_fine_grained_and_binary_labels():
    assert [sst.map_label(k, 5) for k in range(5)] == [0, 1, 2, 3, 4]
    assert [sst.map_label(k, 2) for k in range(5)] == [0, 0, None, 1, 1]
    fine, binary = make_task(classes=5), make_task(classes=2)
    assert [e.label for e in fine.examples["test"]] == [4, 0, 2, 3, 1, 3]
    assert [e.label for e in binary.examples["test"]] == [1, 0, 1, 0, 1]  # neutral dropped
    assert [" ".join(e.words) for e in binary.examples["test"]][1] == "The dreadful plot ."
    phrases = make_task(classes=2, train_phrases=True).examples["train"]
    trees = read_trees(FIXTURES / "sst" / "train.txt")
    nodes = [(w, y) for t in trees for w, y in t.phrases()]
    assert len(phrases) == sum(y != 2 for _, y in nodes) == 19
    assert {e.label for e in phrases} == {0, 1}
    assert make_task(train_phrases=True).examples["dev"] == fine.examples["dev"]  # sentences
    with pytest.raises(ConfigError, match="data.classes must be 5"):
        SSTData(classes=3).validate()


def test_real_binary_split_sizes(real_data_dir):
    task = SSTTask(SSTData(classes=2), SSTModel(), real_data_dir)
    task.use_artefacts(task.build_artefacts())
    task.setup(sst.SPLITS)
    assert {s: len(e) for s, e in task.examples.items()} == {"train": 6920, "dev": 872,
                                                             "test": 1821}
    assert len(task.vocab) == 2 + 18280  # the training sentences' words, cased


def test_vocabulary_comes_from_training_sentences_only(tmp_path):
    d = tmp_path / "sst"
    d.mkdir()
    (d / "train.txt").write_text("(3 (2 Good) (3 (2 good) (2 film)))\n")
    (d / "dev.txt").write_text("(2 (2 unseen) (2 film))\n")
    (d / "test.txt").write_text("(2 (2 GOOD) (2 film))\n")
    task = make_task(data_dir=tmp_path)
    assert task.artefacts["vocab"]["words"] == ["<pad>", "<unk>", "Good", "film", "good"]
    assert task._ids["dev"] == [[sst.UNK, 3]] and task._ids["test"] == [[sst.UNK, 3]]
    folded = SSTTask(SSTData(lowercase=True, verify=False), SSTModel(**SMALL), tmp_path)
    folded.use_artefacts(folded.build_artefacts())
    folded.setup(["test"])
    assert folded.vocab.itos == ["<pad>", "<unk>", "good", "film"]
    assert folded._ids["test"] == [[2, 3]]


def test_batch_plan_is_deterministic_and_covers_every_example():
    task = make_task(classes=2, train_phrases=True)
    p1 = task.train_plan(0, torch.Generator().manual_seed(3))
    p2 = task.train_plan(0, torch.Generator().manual_seed(3))
    assert p1.groups == p2.groups
    assert sorted(i for g in p1.groups for i in g) == list(range(19))
    b = p1[0]
    assert b["words"].shape == (len(p1.groups[0]), int(b["lengths"].max()))
    for row, i in enumerate(p1.groups[0]):
        n = int(b["lengths"][row])
        assert b["words"][row, :n].tolist() == task._ids["train"][i]
        assert not b["words"][row, n:].any()  # <pad> = 0


# -- training ------------------------------------------------------------------------------------
@pytest.mark.parametrize("classes", [5, 2])
def test_a_few_sentences_overfit_to_100_percent_through_the_trainer(classes, tmp_path):
    torch.manual_seed(0)
    task = make_task(classes=classes)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    res = train(task, model, tmp_path, optimizer="adam", lr=0.02, weight_decay=0.0,
                max_epochs=100, max_steps=60, eval_every=20)
    rows = [json.loads(line) for line in RunFiles(tmp_path).metrics.read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] / 5
    assert res.test["accuracy"] == 100.0 and res.test["sentences"] == (6 if classes == 5 else 5)


#: cells that cannot read word vectors in this model, and why
NOT_A_SENTENCE_ENCODER = {
    "dyck-rnn": "reads a 1-d bracket embedding and runs left to right only (the second-order "
                "report's Dyck construction), not word vectors in a bidirectional encoder",
}


@pytest.mark.parametrize("cell", available_cells())
def test_every_registered_cell_trains_on_the_task(cell):
    if cell in NOT_A_SENTENCE_ENCODER:
        pytest.skip(f"{cell}: {NOT_A_SENTENCE_ENCODER[cell]}")
    assert get_cell(cell).bidirectional
    torch.manual_seed(0)
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, cell))
    batch = task.collate("train", list(range(6)))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(12):
        opt.zero_grad()
        out = task.loss(model, batch, None)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    # ln 5 = 1.61 at the start; every cell is at 0.52 or below after 12 steps (measured, seed 0)
    assert losses[-1] < losses[0] - 0.5, losses
    m = task.evaluate(model, "dev")
    assert 0.0 <= m["accuracy"] <= 100.0 and m["sentences"] == 6


def test_pooling_and_layer_mixing_options_in_the_classifier():
    for pooling in ("mean", "last"):
        task = make_task(pooling=pooling, num_layers=2, layer_mix="scalar")
        model = task.build_model(functools.partial(build_encoder, "lstm-srnn"))
        assert model.encoder.pooling == pooling and model.encoder.mix.n == 2
        out = task.loss(model, task.collate("train", [0, 1, 2]), None)
        out.loss.backward()
        assert model.encoder.mix.s.grad.abs().sum() > 0 and model.encoder.mix.gamma.grad != 0
    with pytest.raises(ConfigError, match="model.pooling must be one of max, mean, last"):
        SSTModel(pooling="none").validate()
    task = make_task(cell_options={"pooling": "mean"})
    with pytest.raises(ConfigError, match="set model.pooling instead"):
        task.build_model(functools.partial(build_encoder, "lstm"))


# -- evaluation, predictions, visualize --------------------------------------------------------
def test_predictions_file_is_one_label_per_line_and_is_scored(tmp_path):
    torch.manual_seed(0)
    task = make_task(classes=2)
    model = task.build_model(functools.partial(build_encoder, "gru"))
    path = tmp_path / "pred.txt"
    from_file = task.write_predictions(model, "test", path)
    evaluated = task.evaluate(model, "test")
    assert from_file == pytest.approx(evaluated)
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and set(lines) <= {"0", "1"}
    gold = [str(e.label) for e in task.examples["test"]]
    path.write_text("".join(f"{y}\n" for y in gold))  # the file decides the score
    assert task.score_file("test", path)["accuracy"] == 100.0
    path.write_text("".join(f"{1 - int(y)}\n" for y in gold))
    assert task.score_file("test", path)["accuracy"] == 0.0
    path.write_text("1\n0\n3\n1\n1\n")
    with pytest.raises(DataError, match=r"pred.txt, line 3: '3' is not a label of this setting"):
        task.score_file("test", path)
    path.write_text("1\n0\n")
    with pytest.raises(DataError, match="has 2 lines, but the test split has 5 sentences"):
        task.score_file("test", path)


@pytest.mark.parametrize("classes", [2, 5])
def test_per_sentence_scores_recompute_the_accuracy_and_loss(classes, tmp_path):
    """scores/test.jsonl round trip: each sentence's correct flag and cross-entropy, summed,
    give the task's accuracy and loss; the flags are those of the predictions file."""
    torch.manual_seed(3)
    task = make_task(classes=classes)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    metrics, records = assert_round_trip(task, model, "test", tmp_path)
    task.write_predictions(model, "test", tmp_path / "pred.txt")
    pred = [int(y) for y in (tmp_path / "pred.txt").read_text().split()]
    gold = [e.label for e in task.examples["test"]]
    assert [r["pred"] for r in records] == pred and [r["gold"] for r in records] == gold
    assert [r["correct"] for r in records] == [int(p == g) for p, g in zip(pred, gold)]
    assert sum(r["nll"] for r in records) / len(records) == pytest.approx(metrics["loss"])


def test_evaluation_does_not_depend_on_the_batch_size():
    torch.manual_seed(0)
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, "lstm-srnn-hidden"))
    a = task.evaluate(model, "test")
    task.eval_cfg = SSTEval(batch_size=1)
    b = task.evaluate(model, "test")
    assert a["accuracy"] == b["accuracy"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_visualization_inputs_give_the_weighted_sum_view():
    torch.manual_seed(0)
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, "lstm-srnn-out"))
    enc, x, labels = task.visualization_inputs(model, "A gorgeous ( dull ) film zzz")
    assert labels == ["A", "gorgeous", "(", "dull", ")", "film", "zzz"]
    assert enc is model.encoder and x.shape == (1, 7, 12)
    unk = model.embedding.weight[sst.UNK]
    assert torch.equal(x[0, 2], unk) and torch.equal(x[0, 6], unk)  # -LRB-, zzz: not in training
    from lstmablate.results.figures import weight_norms

    norms = weight_norms(enc, x)[0]
    assert norms.backward is not None and norms.combined.shape == (7, 7)
    with pytest.raises(UserError, match="--text is empty"):
        task.visualization_inputs(model, "  ")


def test_pretrained_vectors_fill_their_rows_and_are_recorded(tmp_path):
    (tmp_path / "sst").mkdir()
    for split in sst.SPLITS:
        (tmp_path / "sst" / f"{split}.txt").write_text(
            "(3 (2 (2 -LRB-) (2 Gorgeous)) (3 (2 writer\\/director) (2 -RRB-)))\n")
    vec = tmp_path / "vec.txt"
    vec.write_text("( 1 2 3\ngorgeous 4 5 6\nGorgeous 7 8 9\nwriter/director 0 1 0\n"
                   ". . . 5 5 5\n")  # a word with spaces, as glove.840B has
    task = make_task(data_dir=tmp_path, pretrained="vec.txt", embedding_size=3)
    prov = task.artefacts["pretrained"]
    assert prov["sha256"] == hashlib.sha256(vec.read_bytes()).hexdigest()
    assert (prov["found"], prov["dim"], prov["file"]) == (3, 3, "vec.txt")
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    row = lambda w: model.embedding.weight[task.vocab.stoi[w]].tolist()  # noqa: E731
    assert row("-LRB-") == [1, 2, 3] and row("Gorgeous") == [7, 8, 9]  # exact case wins
    assert row("writer\\/director") == [0, 1, 0]
    assert max(abs(v) for v in row("-RRB-")) <= 0.05  # no vector: random
    # a later `lstmablate eval` builds from the saved artefacts: the file is not read again
    later = SSTTask(task.data_cfg, task.model_cfg, tmp_path)
    later.use_artefacts(task.artefacts)
    later.setup(["test"])
    assert later.pretrained is None
    with pytest.raises(DataError, match=r"vec.txt, line 1: 3 numbers after the word, expected 4"):
        make_task(data_dir=tmp_path, pretrained="vec.txt", embedding_size=4)
    with pytest.raises(DataError, match="does not exist"):
        make_task(data_dir=tmp_path, pretrained="missing.txt", embedding_size=3)
    with pytest.raises(DataError, match="record no pretrained vectors"):
        SSTTask(task.data_cfg, task.model_cfg, tmp_path).use_artefacts(
            {**task.artefacts, "pretrained": {"file": None}})


def test_catalogue_entry():
    assert SSTTask.datasets == (sst.SST,)
    files = {f.relpath: f for f in sst.SST.files}
    assert list(files) == ["sst/train.txt", "sst/dev.txt", "sst/test.txt"]
    assert files["sst/train.txt"].sha256 == (
        "e2f3f41b0b1e6d4dddc0effe3bfc2d27ed8928079aa9a03d652311614fc5feb7")
    assert files["sst/test.txt"].md5 == "97b75f6ca1ae58b4d52fbf9381dc6f8c"
    assert sst.SST.url.endswith("trainDevTestTrees_PTB.zip") and all(f.note for f in files.values())
