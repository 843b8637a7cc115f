"""The ``squad-drqa`` task end to end on the tiny fixture: config, artefacts, batch plans,
padding, an overfit run through the trainer, predictions scored independently, pretrained
vectors with partial tuning, and a few training steps with every registered cell."""

from __future__ import annotations

import functools
import json
import re
import string
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
import torch

from tolerance import assert_close
from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.config import TrainConfig
from lstmablate.recipes import resolve_config
from lstmablate.errors import ConfigError, DataError
from lstmablate.run.runs import RunFiles
from lstmablate.train import Trainer
from lstmablate_tasks.squad.config import DrQAData, DrQAModel, SquadEval
from lstmablate_tasks.squad.task import DrQATask

from item_scores_check import assert_round_trip

pytest.importorskip("spacy")  # the readers tokenise with spaCy (data.tokenizer: spacy)

FIXTURE = Path(__file__).parent / "fixtures" / "squad"
TINY_MODEL = dict(embedding_dim=24, hidden_size=16, doc_layers=2, question_layers=1)


def make_task(data=None, model=None, eval_cfg=None, data_dir=FIXTURE, splits=("train", "dev"),
              run_dir=None):
    task = DrQATask(DrQAData(verify=False, **(data or {})), DrQAModel(**{**TINY_MODEL, **(model or {})}),
                    data_dir, seed=1, eval_cfg=SquadEval(**(eval_cfg or {})), run_dir=run_dir)
    art = json.loads(json.dumps(task.build_artefacts()))  # artefacts are saved as JSON
    task.use_artefacts(art)
    task.setup(list(splits))
    return task


def make_model(task, cell="lstm"):
    torch.manual_seed(0)
    return task.build_model(functools.partial(build_encoder, cell))


def test_config_defaults_are_drqa_and_unavailable_features_are_refused():
    cfg = resolve_config(DrQATask, "lstm", overrides=["data.splitting=dev-by-article",
                                                      "model.features=[em_cased,tf]"])
    assert cfg.train.optimizer == "adamax" and cfg.train.lr == 0.002 and cfg.train.clip_norm == 10
    assert cfg.train.max_epochs == 40 and cfg.data.batch_size == 32 and cfg.eval.max_span == 15
    assert cfg.model.features == ["em_cased", "tf"] and cfg.model.hidden_size == 128
    cfg = resolve_config(DrQATask, "lstm", overrides=["model.features=[em_lemma]"])
    with pytest.raises(ConfigError, match=r"\['em_lemma'\] need a spaCy pipeline with a tagger"):
        DrQATask(cfg.data, cfg.model, FIXTURE)
    with pytest.raises(ConfigError, match="model.features lists a feature twice"):
        resolve_config(DrQATask, "lstm", overrides=["model.features=[tf,tf]"])
    with pytest.raises(ConfigError, match="data.splitting"):
        resolve_config(DrQATask, "lstm", overrides=["data.splitting=dev-split"])


def test_vocabulary_questions_first_and_features():
    task = make_task()
    words = task.vocab.words
    assert words[:2] == ["<PAD>", "<UNK>"]
    q_words = {unicodedata.normalize("NFD", w) for q in task.examples["train"].questions
               for w in q.words}  # words compared in NFD form, as both DrQAs
    first_context_only = next(i for i, w in enumerate(words[2:], 2) if w not in q_words)
    assert all(w not in q_words for w in words[first_context_only:])  # questions' words first
    assert task.artefacts["features"] == ["em_cased", "em_uncased", "tf"]
    assert task.n_tuned == len(words)  # no pretrained vectors: every row is trained


def test_train_plan_is_deterministic_and_covers_every_question_once():
    task = make_task(data={"batch_size": 6})
    plan_a = task.train_plan(0, torch.Generator().manual_seed(5))
    plan_b = task.train_plan(0, torch.Generator().manual_seed(5))
    plan_c = task.train_plan(0, torch.Generator().manual_seed(6))
    assert plan_a.groups == plan_b.groups and plan_a.groups != plan_c.groups
    assert sorted(i for g in plan_a.groups for i in g) == list(range(20)) and len(plan_a) == 4
    b = plan_a[2]
    assert torch.equal(b["doc_ids"], plan_b[2]["doc_ids"])
    qs = [task.examples["train"].questions[i] for i in plan_a.groups[2]]
    assert b["start"].tolist() == [q.target[0] for q in qs]
    assert b["doc_feats"].shape[-1] == 3


def test_exact_match_and_tf_features():
    from lstmablate_tasks.squad.features import token_features

    from lstmablate_tasks.squad.tokenizer import Token

    def toks(words):
        return [Token(w, 0, len(w)) for w in words]

    f = token_features(toks(["The", "cat", "saw", "the", "Cat"]), toks(["Which", "cat", "?"]))
    assert f[:, 0].tolist() == [0, 1, 0, 0, 0]          # cased match
    assert f[:, 1].tolist() == [0, 1, 0, 0, 1]          # uncased match
    assert f[:, 2].tolist() == pytest.approx([2 / 5, 2 / 5, 1 / 5, 2 / 5, 2 / 5])  # tf


def test_padding_never_changes_scores():
    task = make_task(splits=("dev",))
    model = make_model(task).eval()
    ex = task.examples["dev"]
    group = [0, 5, 12]  # contexts of different lengths
    with torch.no_grad():
        start, end = task.span_scores(model, task.collate(ex, group))
        for k, qi in enumerate(group):
            s1, e1 = task.span_scores(model, task.collate(ex, [qi]))
            n = s1.shape[1]
            # float32 scores of another batch shape: to rounding at the scores' scale
            assert_close(start[k, :n], s1[0], msg="start")
            assert_close(end[k, :n], e1[0], msg="end")
            assert torch.isinf(start[k, n:]).all()


def _official_evaluate(dataset_json: dict, predictions: dict) -> dict:
    """The SQuAD v1.1 evaluation script's procedure, written out independently of the task
    (raw JSON in, no tokenisation): normalise, EM, token F1, max over golds, x100."""
    def norm(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(p, g):
        p, g = norm(p).split(), norm(g).split()
        same = sum((Counter(p) & Counter(g)).values())
        return 0.0 if same == 0 else 2 * (same / len(p)) * (same / len(g)) / (same / len(p) + same / len(g))

    em = f = total = 0
    for art in dataset_json["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                total += 1
                if qa["id"] in predictions:
                    golds = [a["text"] for a in qa["answers"]]
                    em += max(norm(predictions[qa["id"]]) == norm(g) for g in golds)
                    f += max(f1(predictions[qa["id"]], g) for g in golds)
    return {"em": 100.0 * em / total, "f1": 100.0 * f / total}


def test_overfit_20_questions_through_the_trainer(tmp_path):
    """Loss falls and F1 > 95 on the 20 training questions; the predictions file written
    for them scores the same with an independent implementation of the official script."""
    task = make_task(data={"batch_size": 5}, model={"dropout_emb": 0.0, "dropout_rnn": 0.0},
                     run_dir=tmp_path)
    model = make_model(task)
    losses = []
    original_loss = task.loss

    def recording_loss(m, batch, carry):
        out = original_loss(m, batch, carry)
        losses.append(float(out.loss.detach()))
        return out

    task.loss = recording_loss
    cfg = TrainConfig(optimizer="adamax", lr=0.01, clip_norm=10.0, max_epochs=25, eval_test=False)
    Trainer(cfg, task, model, RunFiles(tmp_path / "run"), seed=1, device=torch.device("cpu"),
            identity={"task": "squad-drqa"}, progress=False).fit()
    assert sum(losses[-4:]) / 4 < 0.05 * sum(losses[:4]) / 4
    model.eval()
    metrics = task.evaluate(model, "train")
    assert metrics["f1"] > 95 and metrics["em"] > 90 and metrics["questions"] == 20

    path = tmp_path / "preds.json"
    written = task.write_predictions(model, "train", path)
    preds = json.loads(path.read_text(encoding="utf-8"))
    assert set(preds) == {q.qid for q in task.examples["train"].questions}
    raw = json.loads((FIXTURE / "squad" / "train-v1.1.json").read_text(encoding="utf-8"))
    contexts = {qa["id"]: par["context"] for a in raw["data"] for par in a["paragraphs"] for qa in par["qas"]}
    assert all(preds[q] in contexts[q] for q in preds)  # exact original text
    independent = _official_evaluate(raw, preds)
    assert written["em"] == pytest.approx(independent["em"]) == pytest.approx(metrics["em"])
    assert written["f1"] == pytest.approx(independent["f1"]) == pytest.approx(metrics["f1"])


def test_dev_predictions_respect_the_span_limit(tmp_path):
    task = make_task(splits=("dev",), eval_cfg={"max_span": 3, "batch_size": 4})
    model = make_model(task)
    preds = task.predict(model, "dev")
    for q in task.examples["dev"].questions:
        assert len(task.tokenizer.tokenize(preds[q.qid])) <= 3
    raw = json.loads((FIXTURE / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    written = task.write_predictions(model, "dev", tmp_path / "dev.json")
    assert written["f1"] == pytest.approx(_official_evaluate(raw, preds)["f1"])
    assert written == task.evaluate(model, "dev")


def test_standin_split_trains_on_other_articles():
    task = make_task(data={"splitting": "dev-by-article", "standin_dev_articles": 1})
    train_ids = {q.qid for q in task.examples["train"].questions}
    dev_ids = {q.qid for q in task.examples["dev"].questions}
    assert len(train_ids) == 8 and len(dev_ids) == 5 and not train_ids & dev_ids
    assert not {p.context for p in task.examples["train"].paragraphs} & \
        {p.context for p in task.examples["dev"].paragraphs}


VECTORS = Path(__file__).parent / "fixtures" / "vectors" / "glove.squad.24d.txt"


def read_fixture_vectors():
    """{NFD word: [vectors]} of the GloVe-format fixture (a word may contain a space)."""
    out: dict[str, list[list[float]]] = {}
    for line in VECTORS.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        out.setdefault(unicodedata.normalize("NFD", " ".join(parts[:-24])), []).append(
            [float(v) for v in parts[-24:]])
    return out


def test_vocabulary_is_train_and_dev_words_with_a_vector(tmp_path):
    """As hitvoice/DrQA (prepro.py: train + dev) and facebookresearch/DrQA (train_exs +
    dev_exs): the words of the training and dev data that have a vector, compared in NFD form;
    a dev-only word reads its fixed vector, a word without a vector reads <UNK>; duplicates
    that NFD makes equal are averaged."""
    vectors = read_fixture_vectors()
    task = make_task(model={"pretrained": str(VECTORS), "tune_partial": 3})
    nfd = lambda w: unicodedata.normalize("NFD", w)  # noqa: E731
    train, dev = task.examples["train"], task.examples["dev"]
    words_of = lambda ex: {nfd(w) for q in ex.questions for w in q.words} | \
        {nfd(w) for p in ex.paragraphs for w in p.words}  # noqa: E731
    assert set(task.vocab.words[2:]) == (words_of(train) | words_of(dev)) & set(vectors)
    dev_only = sorted((words_of(dev) - words_of(train)) & set(vectors))
    assert dev_only and all(w in task.vocab for w in dev_only)
    without = sorted(words_of(train) - set(vectors))
    assert without and task.vocab.ids(without) == [1] * len(without)  # <UNK>
    assert task.n_tuned == 5  # <PAD>, <UNK> and the top-3 question words
    model = make_model(task)
    emb = model.embedding
    for w in dev_only[:3] + [nfd("Frédéric")]:
        want = torch.tensor(vectors[w]).mean(0)  # Frédéric: NFC and NFD lines averaged
        assert len(vectors[w]) == (2 if w == nfd("Frédéric") else 1)
        torch.testing.assert_close(emb.weight[task.vocab.index[w]].detach(), want)
    # <UNK> keeps nn.Embedding's N(0, 1) draw (both DrQAs copy vectors into rows 2.. only)
    assert emb.weight[1].abs().sum() > 0 and emb.weight[0].abs().sum() == 0


def test_fixed_rows_count_in_the_clip_norm_and_are_reset(tmp_path):
    """fixed_rows=reset (DrQA's reset_parameters): the fixed rows get gradients, which count
    in the gradient norm that clipping sees, and every forward uses their pretrained values
    again after the optimiser moved them; constant: a buffer without gradient."""
    task = make_task(model={"pretrained": str(VECTORS), "tune_partial": 3})
    model = make_model(task)
    emb = model.embedding
    assert emb.fixed_grad and isinstance(emb.fixed, torch.nn.Parameter)
    before = emb.weight.detach().clone()
    batch = task.train_plan(0, torch.Generator().manual_seed(0))[0]
    task.loss(model, batch, None).loss.backward()
    assert emb.fixed.grad is not None and emb.fixed.grad.abs().sum() > 0
    all_grads = [p.grad for p in model.parameters() if p.grad is not None]
    with_fixed = torch.linalg.vector_norm(torch.stack([g.norm() for g in all_grads]))
    without = torch.linalg.vector_norm(torch.stack([g.norm() for g in all_grads if g is not emb.fixed.grad]))
    assert with_fixed > without  # the fixed rows' gradient is part of the clipped norm
    opt = torch.optim.Adamax(model.parameters(), lr=0.1)
    opt.step()
    assert not torch.equal(emb.fixed.detach(), before[5:])  # the optimiser moved them ...
    emb(torch.tensor([[0]]))  # ... and the next use puts them back
    after = emb.weight.detach()
    assert torch.equal(after[5:], before[5:])
    assert not torch.equal(after[2:5], before[2:5])  # the tuned rows moved
    assert torch.equal(after[0], before[0])  # padding
    constant = make_model(make_task(model={"pretrained": str(VECTORS), "tune_partial": 3,
                                           "fixed_rows": "constant"}))
    assert not constant.embedding.fixed_grad and "embedding.fixed" not in dict(constant.named_parameters())


def test_bad_vector_file_names_file_and_line(tmp_path):
    vec = tmp_path / "vectors.txt"
    vec.write_text("the " + " ".join(["0.1"] * 24) + "\ncat 0.1 0.2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"vectors.txt, line 2: 2 numbers after the word, expected "
                                        r"24 \(model.embedding_dim\)"):
        make_task(model={"pretrained": str(vec)})
    with pytest.raises(DataError, match=r"vectors file .* was not found\. DrQA uses GloVe 840B 300d\."
                                        r".*--set model\.pretrained=.*report. marks"):
        make_task(model={"pretrained": "nowhere/glove.txt"})


def test_missing_data_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"squad/train-v1.1.json not found.*stand-in split of "
                                        r"the dev file.*data.splitting=dev-by-article"):
        make_task(data_dir=tmp_path)


BIDIRECTIONAL_CELLS = [c for c in available_cells() if get_cell(c).bidirectional]
SKIPPED = {c: "not bidirectional (the Dyck-RNN reads a fixed 1-d/2-d bracket code)"
           for c in available_cells() if not get_cell(c).bidirectional}


@pytest.mark.parametrize("cell", available_cells())
def test_a_few_steps_with_every_cell(cell):
    if cell in SKIPPED:
        pytest.skip(f"{cell}: {SKIPPED[cell]}")
    task = make_task(data={"batch_size": 10}, model={"dropout_emb": 0.0, "dropout_rnn": 0.0})
    model = make_model(task, cell)
    encoders = [m for m in model.modules() if type(m).__name__ == "Encoder"]
    assert len(encoders) == 3 and all(e.cell_name == get_cell(cell).name for e in encoders)
    opt = torch.optim.Adamax(model.parameters(), lr=0.01)
    batch = task.train_plan(0, torch.Generator().manual_seed(0))[0]
    losses = []
    for _ in range(4):  # a few steps on one batch: its loss must fall
        out = task.loss(model, batch, None)
        assert torch.isfinite(out.loss)
        opt.zero_grad()
        out.loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < losses[0]


def test_visualization_inputs():
    task = make_task(splits=("dev",))
    model = make_model(task).eval()
    enc, x, labels = task.visualization_inputs(model, "Who won Super Bowl 50?")
    assert x.shape == (1, 6, 24) and enc is model.question_rnn.layers[0]
    assert labels[0] in ("Who", "Who (<UNK>)")


def test_per_question_scores_recompute_em_and_f1(tmp_path):
    """scores/dev.jsonl round trip: each question's EM and F1 (max over its gold answers)
    averaged give the official EM/F1; every question of the file has its record, by id."""
    task = make_task(splits=("dev",))
    model = make_model(task, "lstm-srnn")
    metrics, records = assert_round_trip(task, model, "dev", tmp_path)
    raw = json.loads((FIXTURE / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    ids = [qa["id"] for a in raw["data"] for par in a["paragraphs"] for qa in par["qas"]]
    assert [r["id"] for r in records] == ids
    assert all(r["em"] in (0.0, 1.0) and 0 <= r["f1"] <= 1 and r["em"] <= r["f1"] for r in records)
    assert metrics["f1"] > 0  # some overlap, even untrained
    preds = task.predict(model, "dev")
    for r in records:  # each question alone, by the independent official procedure
        qa = {"data": [{"paragraphs": [{"qas": [q for a in raw["data"] for p in a["paragraphs"]
                                                 for q in p["qas"] if q["id"] == r["id"]]}]}]}
        alone = _official_evaluate(qa, preds)
        assert 100 * r["f1"] == pytest.approx(alone["f1"]) and 100 * r["em"] == alone["em"]
