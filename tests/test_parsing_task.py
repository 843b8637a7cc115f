"""The ``parsing`` task end to end: artefacts, batch plans, training with the trainer (an
overfit run, every registered cell), predictions files, visualisation, real UD EWT."""

from __future__ import annotations

import functools
import json
import os
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
from lstmablate_tasks.parsing.conllu import read_conllu
from lstmablate_tasks.parsing.metrics import attachment_scores
from lstmablate_tasks.parsing.task import ParsingData, ParsingEval, ParsingModel, ParsingTask

from item_scores_check import assert_round_trip

FIXTURES = Path(__file__).parent / "fixtures" / "parsing"
DATA_DIR = FIXTURES.parent  # data.files = "parsing" or "parsing/overfit" under it

SMALL = dict(word_size=16, tag_size=16, hidden_size=16, num_layers=2, arc_mlp=16, rel_mlp=8)
NO_DROPOUT = dict(word_dropout=0.0, tag_dropout=0.0, input_dropout=0.0, recurrent_dropout=0.0,
                  mlp_dropout=0.0)


def make_task(files="parsing", data_dir=DATA_DIR, splits=("train", "dev", "test"), eval_cfg=None,
              **model):
    torch.manual_seed(0)
    task = ParsingTask(ParsingData(files=files, n_buckets=3), ParsingModel(**{**SMALL, **model}),
                       data_dir, seed=1, eval_cfg=eval_cfg)
    task.use_artefacts(task.build_artefacts())
    task.setup(splits)
    return task


def train(task, model, tmp_path, **train):
    cfg = update_dataclass(TrainConfig(), dict(ParsingTask.train_defaults), "train", "defaults")
    cfg = update_dataclass(cfg, train, "train", "test")
    trainer = Trainer(cfg, task, model, RunFiles(tmp_path), seed=1, device=torch.device("cpu"),
                      identity={"task": "parsing"}, progress=False)
    return trainer.fit()


def test_defaults_are_parser_v1s():
    m, d, e = ParsingModel(), ParsingData(), ParsingEval()
    assert (m.word_size, m.tag_size, m.hidden_size, m.num_layers, m.arc_mlp, m.rel_mlp) == (
        100, 100, 400, 3, 500, 100)
    assert {m.word_dropout, m.tag_dropout, m.input_dropout, m.recurrent_dropout,
            m.mlp_dropout} == {0.33}
    assert (d.min_word_count, d.n_buckets, d.batch_tokens) == (2, 40, 5000)
    assert e.decoder == "parser-v1" and m.pretrained == ""
    t = ParsingTask.train_defaults
    assert (t["optimizer"], t["lr"], t["betas"], t["eps"]) == ("adam", 2e-3, (0.9, 0.9), 1e-12)
    assert (t["schedule"], t["decay"], t["decay_steps"], t["clip_norm"]) == (
        "exponential", 0.75, 5000, 5.0)
    assert (t["max_steps"], t["eval_every"]) == (50_000, 100)
    assert ParsingTask.primary.name == "las" and ParsingTask.datasets[0].name == "ud-ewt"


def test_config_values_are_checked():
    with pytest.raises(ConfigError, match="eval.decoder must be one of parser-v1, mst"):
        ParsingEval(decoder="cle").validate()
    with pytest.raises(ConfigError, match="model.recurrent_dropout"):
        ParsingModel(recurrent_dropout=1.0).validate()
    with pytest.raises(ConfigError, match="data.batch_tokens"):
        ParsingData(batch_tokens=0).validate()


def test_batches_and_plan():
    task = make_task()
    assert task.artefacts["words"][:3] == ["<pad>", "<root>", "<unk>"]
    b = task.collate("dev", [0, 1])  # "tea" (7 words) and "cat" (7 words)
    assert b["words"].shape == (2, 8) and b["lengths"].tolist() == [8, 8]
    assert b["words"][:, 0].tolist() == [1, 1] and b["tags"][:, 0].tolist() == [1, 1]  # ROOT
    assert b["heads"][0].tolist() == [0, 2, 0, 2, 5, 2, 5, 2]
    assert b["rels"][0, 0] == -100
    assert [task.vocabs.rels.itos[r] for r in b["rels"][0, 1:]] == [
        "nsubj", "root", "obj", "cc", "conj", "orphan", "punct"]
    p1 = task.train_plan(0, torch.Generator().manual_seed(7))
    p2 = task.train_plan(0, torch.Generator().manual_seed(7))
    assert p1.groups == p2.groups and len(p1) >= 1
    assert sorted(i for g in p1.groups for i in g) == list(range(6))
    for i in range(len(p1)):
        assert all(torch.equal(p1[i][k], task.collate("train", p1.groups[i])[k]) for k in p1[i])


def test_two_sentences_overfit_to_100_uas(tmp_path):
    task = make_task("parsing/overfit", **NO_DROPOUT)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    res = train(task, model, tmp_path, lr=0.01, max_steps=80, eval_every=20)
    rows = [json.loads(line) for line in RunFiles(tmp_path).metrics.read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] / 10
    assert res.test["uas_all"] == 100.0 and res.test["las_all"] == 100.0
    assert res.test["uas"] == 100.0


@pytest.mark.parametrize("cell", available_cells())
def test_every_registered_cell_trains_the_parser(cell, tmp_path):
    if not get_cell(cell).bidirectional:
        pytest.skip(f"{cell} cannot run right to left (the parser's encoder is bidirectional)")
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, cell))
    batch = task.collate("train", list(range(6)))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2, betas=(0.9, 0.9))
    losses = []
    for _ in range(20):
        opt.zero_grad()
        out = task.loss(model, batch, None)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        losses.append(out.loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    # dropout on: every cell goes from 4.85 to between 3.2 and 4.2 (measured, seed 0)
    assert sum(losses[-3:]) / 3 < losses[0] - 0.4, losses
    metrics = task.evaluate(model, "dev")
    assert 0.0 <= metrics["las"] <= metrics["uas"] <= 100.0


def test_interrupted_and_resumed_training_is_exact(tmp_path):
    """Ctrl-C after step 5 and --resume give the metrics of an uninterrupted run (the epoch
    plans come from the trainer's generator, dropout from the checkpointed RNG)."""
    def trainer(run_dir):
        task = make_task()
        torch.manual_seed(0)
        model = task.build_model(functools.partial(build_encoder, "lstm"))
        cfg = update_dataclass(TrainConfig(), dict(ParsingTask.train_defaults), "train", "d")
        cfg = update_dataclass(cfg, {"max_steps": 10, "eval_every": 2, "lr": 0.01}, "train", "t")
        return Trainer(cfg, task, model, RunFiles(run_dir), seed=1, device=torch.device("cpu"),
                       identity={"task": "parsing"}, progress=False)

    trainer(tmp_path / "straight").fit()
    first = trainer(tmp_path / "cut")
    step = first._train_step

    def stop_after_five(batch):
        out = step(batch)
        if first.pos.step == 5:
            first._stop_signal = "SIGINT"
        return out

    first._train_step = stop_after_five
    assert first.fit().interrupted
    trainer(tmp_path / "cut").fit(resume=True)
    straight = RunFiles(tmp_path / "straight").metrics.read_text()
    assert len(straight.splitlines()) == 5
    assert RunFiles(tmp_path / "cut").metrics.read_text() == straight


def test_predictions_file_round_trip_equals_evaluate(tmp_path):
    for decoder in ("parser-v1", "mst"):
        task = make_task(eval_cfg=ParsingEval(decoder=decoder, batch_tokens=20))
        model = task.build_model(functools.partial(build_encoder, "lstm-srnn"))
        train(task, model, tmp_path / decoder, lr=0.01, max_steps=10, eval_every=5, eval_test=False)
        out = tmp_path / f"pred-{decoder}.conllu"
        from_file = task.write_predictions(model, "test", out)
        assert from_file == task.evaluate(model, "test", final=True)
        gold = read_conllu(FIXTURES / "test.conllu")
        pred = read_conllu(out)  # well-formed CoNLL-U: a tree per sentence, gold words
        assert [s.words for s in pred] == [s.words for s in gold]
        assert [s.xpos for s in pred] == [s.xpos for s in gold]
        assert all(s.heads.count(0) == 1 for s in pred)


def test_per_sentence_scores_recompute_uas_and_las_in_every_convention(tmp_path):
    """scores/test.jsonl round trip: each sentence's scored words, right heads and right
    labels under the three punctuation conventions give the task's six attachment scores; per
    sentence they are the counts of the predictions file scored alone."""
    task = make_task(**NO_DROPOUT)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    train(task, model, tmp_path / "run", lr=0.01, max_steps=20, eval_every=20, eval_test=False)
    metrics, records = assert_round_trip(task, model, "test", tmp_path)
    assert 0 < metrics["las_all"] < metrics["uas_all"] < 100  # some heads and labels right
    task.write_predictions(model, "test", tmp_path / "pred.conllu")
    gold, pred = read_conllu(FIXTURES / "test.conllu"), read_conllu(tmp_path / "pred.conllu")
    for r, g, p in zip(records, gold, pred, strict=True):
        alone = attachment_scores([g], [p.heads], [p.deprels])
        assert r["scored_all"] == len(g) == alone["words"] and r["scored"] == alone["scored_words"]
        for c in ("", "_all", "_upos"):
            if r[f"scored{c}"]:
                assert 100 * r[f"heads{c}"] / r[f"scored{c}"] == pytest.approx(alone[f"uas{c}"])
                assert 100 * r[f"labels{c}"] / r[f"scored{c}"] == pytest.approx(alone[f"las{c}"])


def test_evaluation_does_not_depend_on_batching():
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, "gru"))
    with torch.no_grad():
        model.arc_weight.normal_()
        model.rel_weight.normal_()
    a = task.evaluate(model, "train")
    task.eval_cfg = ParsingEval(batch_tokens=1)
    assert task.evaluate(model, "train") == a


def test_visualization_inputs_for_the_appendix_a_picture():
    task = make_task()
    model = task.build_model(functools.partial(build_encoder, "lstm-srnn-out"))
    enc, x, labels = task.visualization_inputs(model, "The/DET cat/NOUN sat/VERB zzz")
    assert labels == ["<root>", "The", "cat", "sat", "zzz"]
    assert x.shape == (1, 5, 32) and enc is model.encoder and enc.bidirectional
    views = enc.weighted_sum(x)
    assert len(views) == 2 and len(views[0]) == 2  # layers x directions
    with pytest.raises(UserError, match="unknown tag 'NOPE'"):
        task.visualization_inputs(model, "cat/NOPE")
    from lstmablate.results.figures import weight_norms
    norms = weight_norms(enc, x)[0]
    assert norms.backward is not None and norms.combined.shape == (5, 5)


def test_pretrained_vectors_are_checked_and_added(tmp_path):
    data = tmp_path / "data"
    (data / "parsing").mkdir(parents=True)
    for s in ("train", "dev", "test"):
        (data / "parsing" / f"{s}.conllu").write_text((FIXTURES / f"{s}.conllu").read_text())
    (data / "vec.txt").write_text("the 1 0 2 0\ncat 0 3 0 1\nhowl 2 2 2 2\n")
    task = make_task(data_dir=data, pretrained="vec.txt")
    assert len(task.artefacts["pretrained_sha256"]) == 64
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    assert model.word_embed.weight.shape[1] == 4 and model.pretrained.shape == (6, 4)
    b = task.collate("test", [0])  # dogs don't bark, they howl: "howl" has a vector
    howl = read_conllu(FIXTURES / "test.conllu")[0].words.index("howl") + 1
    assert b["pret"][0, howl] == 5 and b["pret"][0, 1] == 2  # "dogs": no vector -> UNK
    assert task.evaluate(model, "test")["words"] == 24
    (data / "vec.txt").write_text("the 1 0 2 0\ncat 0 3 0 1\nhowl 2 2 2 3\n")
    later = ParsingTask(task.data_cfg, task.model_cfg, data, seed=1)  # e.g. `lstmablate eval`
    later.use_artefacts(task.artefacts)
    with pytest.raises(DataError, match="not the file this run was trained with"):
        later.setup(["test"])
    with pytest.raises(DataError, match="missing.txt was not found"):
        make_task(data_dir=data, pretrained="missing.txt")


def test_real_ud_ewt_dev_scored_words(real_data_dir):
    task = ParsingTask(ParsingData(), ParsingModel(**SMALL), real_data_dir, seed=1)
    task.use_artefacts(task.build_artefacts())
    assert len(task.artefacts["rels"]) == 51 and len(task.artefacts["tags"]) == 3 + 17
    task.setup(["dev"])
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    m = task.evaluate(model, "dev")
    # 25,147 words; Parser-v1 leaves out 91 `` + 88 '' + 106 : + 931 , + 1,503 . = 2,719
    assert m["words"] == 25147 and m["scored_words"] == 25147 - 2719
    assert 0 <= m["las"] <= m["uas"] <= 100


def parsing_entry_points(tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess that finds the parsing plugin: installed, or (until
    pyproject.toml declares it) through a dist-info folder on PYTHONPATH."""
    from lstmablate.task import available_tasks

    env = dict(os.environ, LSTMABLATE_DATA=str(DATA_DIR))
    if "parsing" in available_tasks():
        return env
    dist = tmp_path / "site" / "lstmablate_parsing_entry-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lstmablate-parsing-entry\n"
                                   "Version: 0\n")
    (dist / "entry_points.txt").write_text(
        "[lstmablate.tasks]\nparsing = lstmablate_tasks.parsing.task:ParsingTask\n")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(dist.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.mark.slow  # ~20-25 s: five CLI processes
def test_cli_train_eval_and_predictions(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("task: parsing\nexperiment: tiny-parse\ndata: {files: parsing, n_buckets: 3}\n"
                      "model: {word_size: 8, tag_size: 8, hidden_size: 8, num_layers: 1, arc_mlp: 8,"
                      " rel_mlp: 4}\ntrain: {max_steps: 6, eval_every: 3}\n")
    env = parsing_entry_points(tmp_path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "lstmablate", *a], cwd=tmp_path,  # noqa: E731
                                    env=env, capture_output=True, text=True, timeout=300)
    r = run("train", "--task", "parsing", "--cell", "lstm-srnn", "--recipe", str(recipe),
            "--threads", "1", "--out", "runs")
    assert r.returncode == 0, r.stderr
    rd = tmp_path / "runs" / "tiny-parse" / "lstm-srnn" / "seed-1"
    saved = {p.name for p in RunFiles(rd).artefacts.iterdir()}
    assert saved, "the vocabularies are kept with the run"
    result = json.loads(RunFiles(rd).result.read_text())
    assert result["steps"] == 6 and set(result["test"]) >= {"uas", "las", "uas_all", "las_upos"}
    r = run("eval", str(rd), "--split", "test", "--checkpoint", "last", "--json",
            "--write-predictions", "pred.conllu")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["las"] == pytest.approx(result["test"]["las"])
    pred = read_conllu(tmp_path / "pred.conllu")
    assert [s.words for s in pred] == [s.words for s in read_conllu(FIXTURES / "test.conllu")]
    r = run("eval", str(rd), "--split", "dev", "--checkpoint", "last", "--json",
            "--set", "eval.decoder=mst")
    assert r.returncode == 0, r.stderr
    assert 0 <= json.loads(r.stdout)["uas"] <= 100
    r = run("eval", str(rd), "--split", "dev", "--set", "eval.decoder=cle")
    assert r.returncode == 2 and "eval.decoder must be one of parser-v1, mst" in " ".join(
        r.stderr.split())
    crlf = tmp_path / "win.conllu"
    crlf.write_bytes((FIXTURES / "dev.conllu").read_bytes().replace(b"\n", b"\r\n"))
    r = run("data", "validate-conllu", str(crlf))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "win.conllu, line 1: malformed CoNLL-U: the line ends in CR LF" in " ".join(r.stderr.split())
    r = run("data", "validate-conllu", str(FIXTURES / "dev.conllu"))
    assert r.returncode == 0 and "3 sentences, 21 words" in r.stdout
