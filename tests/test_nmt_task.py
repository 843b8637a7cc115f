"""The nmt task end to end on a 10-pair fixture corpus: artefacts, an overfit run (loss falls,
greedy output = the training targets, BLEU 100), the predictions files, every registered
cell, and a run through the trainer."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.errors import DataError
from lstmablate.run.runs import RunFiles
from lstmablate_tasks.nmt.search import greedy_search
from lstmablate_tasks.nmt.task import NMTData, NMTEval, NMTModelConfig, NMTTask

from item_scores_check import assert_round_trip

FIXTURES = Path(__file__).parent / "fixtures" / "nmt"
SMALL = dict(word_vec_size=32, hidden_size=64, dropout=0.0)


def _task(model=None, eval_cfg=None, data_dir=FIXTURES, run_dir=None) -> NMTTask:
    t = NMTTask(NMTData(verify=False), model or NMTModelConfig(**SMALL), data_dir,
                eval_cfg=eval_cfg or NMTEval(), run_dir=run_dir)
    t.use_artefacts(json.loads(json.dumps(t.build_artefacts())))  # as saved with a run
    t.setup(["train", "val", "test"])
    return t


@pytest.fixture(scope="module")
def overfit():
    """A small model trained on the 10 training pairs until it knows them by heart."""
    torch.manual_seed(0)
    task = _task()
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for epoch in range(200):
        for batch in task.train_plan(epoch, torch.Generator().manual_seed(epoch)):
            out = task.loss(model, batch, None)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
    return task, model.eval(), losses


def test_artefacts_are_the_vocabularies_and_the_tokeniser():
    t = NMTTask(NMTData(verify=False), NMTModelConfig(), FIXTURES)
    art = t.build_artefacts()
    assert art["train_pairs"] == 10  # 11 lines, the last one deleted
    assert art["src_vocab"][:2] == ["<unk>", "<blank>"]
    assert art["tgt_vocab"][:4] == ["<unk>", "<blank>", "<s>", "</s>"]
    assert "dropped" not in art["src_vocab"] and "ice" in art["src_vocab"] and "@-@" in art["src_vocab"]
    assert art["tokeniser"]["aggressive_dash_splits"] is True and art["tokeniser"]["escape"] is False
    bad = dict(art, tokeniser=dict(art["tokeniser"], escape=True))
    with pytest.raises(DataError, match="tokenised with"):
        t.use_artefacts(bad)
    with pytest.raises(DataError, match="lack 'tgt_vocab'"):
        t.use_artefacts({"src_vocab": art["src_vocab"]})


def test_overfit_run_learns_the_pairs(overfit):
    task, model, losses = overfit
    assert losses[-1] < 0.05 * losses[0]
    sd = task.splits["test"]
    batch = task._collate(sd, range(len(sd.src_ids)), with_target=False)
    mem = model.encode(batch["src"], batch["src_lengths"])
    greedy = greedy_search(model, mem, task.tgt_vocab.bos, task.tgt_vocab.eos, 100)
    assert [task.tgt_vocab.decode(h.tokens) for h in greedy] == sd.tgt_tokens
    metrics = task.evaluate(model, "test", final=True)  # beam 5, as translate.py
    assert metrics["bleu"] == pytest.approx(100.0) and metrics["sacrebleu"] == pytest.approx(100.0)
    ppl = task.evaluate(model, "test")
    assert ppl["ppl"] < 1.1 and ppl["acc"] == 100.0 and ppl["tokens"] == sum(
        len(t) + 1 for t in sd.tgt_tokens)  # every word and </s>


def test_the_second_decoding_adds_the_length_normalised_bleus(overfit):
    """eval.also_length_normalised: the final metrics also hold 18d3d2e1's decoding, prefixed;
    on a model that knows its pairs by heart both rankings translate them exactly."""
    task, model, _ = overfit
    plain = task.evaluate(model, "test", final=True)
    assert not any(k.startswith("lennorm_") for k in plain)
    task.eval_cfg.also_length_normalised = True
    try:
        both, records = task.evaluate_items(model, "test")
    finally:
        task.eval_cfg.also_length_normalised = False
    assert {k: both[k] for k in plain} == plain
    assert {k[len("lennorm_"):]: v for k, v in both.items() if k.startswith("lennorm_")} == plain
    assert [r["lennorm_hyp"] for r in records] == [r["hyp"] for r in records]


def test_predictions_files_round_trip(overfit, tmp_path):
    task, model, _ = overfit
    path = tmp_path / "test.de"
    metrics = task.write_predictions(model, "test", path)
    assert metrics == task.evaluate(model, "test", final=True)
    assert path.read_text(encoding="utf-8").splitlines() == task.splits["test"].tgt_raw
    atok = path.with_name("test.de.atok").read_text(encoding="utf-8").splitlines()
    assert atok == [" ".join(t) for t in task.splits["test"].tgt_tokens]
    scores = path.with_name("test.de.bleu").read_text(encoding="utf-8")
    assert "BLEU = 100.00" in scores and "tok:13a" in scores
    # the metrics come from the files: damage one line and BLEU drops
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[0] = "Falsch"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got, _, _ = task.score_files("test", path, path.with_name("test.de.atok"))
    assert got["sacrebleu"] < 100 and got["bleu"] == pytest.approx(100.0)
    path.write_text("nur eine Zeile\n", encoding="utf-8")
    with pytest.raises(DataError, match="has 1 lines, but the test split has 10"):
        task.score_files("test", path, path.with_name("test.de.atok"))


def damaged_translations(task, model, every: int, word: str = "Falsch"):
    """The model's translations of the test split with every ``every``-th word replaced."""
    words = task.translate(model, "test")
    n = 0
    out = []
    for sentence in words:
        row = []
        for w in sentence:
            n += 1
            row.append(word if n % every == 0 else w)
        out.append(row)
    return out


def test_per_sentence_scores_recompute_both_bleus(overfit, tmp_path, monkeypatch):
    """scores/test.jsonl round trip: each sentence's BLEU statistics (sacreBLEU's own, both
    the tokenised multi-bleu.perl setting and the standard detokenised one), summed, give the
    task's two BLEUs; the translations are damaged so that BLEU is neither 0 nor 100."""
    from sacrebleu.metrics import BLEU

    task, model, _ = overfit
    damaged = damaged_translations(task, model, every=7)
    monkeypatch.setattr(task, "translate", lambda m, split: damaged)
    metrics, records = assert_round_trip(task, model, "test", tmp_path)
    assert 0 < metrics["bleu"] < 100 and 0 < metrics["sacrebleu"] < 100
    sd = task.splits["test"]
    assert [r["hyp_tok"] for r in records] == [" ".join(w) for w in damaged]
    refs_tok = [" ".join(t) for t in sd.tgt_tokens]
    tokenised = BLEU(tokenize="none", smooth_method="none", force=True)
    assert [r["bleu"] for r in records] == [
        tokenised._extract_corpus_statistics([r["hyp_tok"]], [[ref]])[0]
        for r, ref in zip(records, refs_tok)]
    assert metrics["bleu"] == pytest.approx(
        tokenised.corpus_score([r["hyp_tok"] for r in records], [refs_tok]).score, rel=1e-12)
    assert metrics["sacrebleu"] == pytest.approx(
        BLEU().corpus_score([r["hyp"] for r in records], [sd.tgt_raw]).score, rel=1e-12)


def test_translate_replaces_unk_with_the_attended_source_word(overfit, monkeypatch):
    """-replace_unk in translate(): each sentence's <unk> becomes the word of *that* sentence
    its attention peaks on (sentences are batched by length, so the order is checked too).
    The decoder is replaced by one that emits "<unk> ." attending to source position 1."""
    import lstmablate_tasks.nmt.task as nmt_task
    from lstmablate_tasks.nmt.search import Hypothesis

    task, model, _ = overfit
    unk, dot = task.tgt_vocab.unk, task.tgt_vocab.stoi["."]

    def fake_greedy(model, mem, bos, eos, max_length):
        S = mem.memory.shape[1]
        att = torch.zeros(2, S)
        att[0, 1] = 1.0
        att[1, 0] = 1.0
        return [Hypothesis([unk, dot], 0.0, att) for _ in range(mem.memory.shape[0])]

    monkeypatch.setattr(nmt_task, "greedy_search", fake_greedy)
    task.eval_cfg = NMTEval(beam_size=1)
    got = task.translate(model, "test")
    assert got == [[src[1], "."] for src in task.splits["test"].src_tokens]
    task.eval_cfg = NMTEval(beam_size=1, replace_unk=False)
    assert task.translate(model, "test")[0] == ["<unk>", "."]
    task.eval_cfg = NMTEval()


#: cells that cannot be an NMT encoder, and why
NOT_AN_ENCODER = {
    "dyck-rnn": "reads a 1-d bracket embedding (input size 1, one layer, the second-order "
                "report's Dyck construction), not 500-d word vectors",
}


@pytest.mark.parametrize("cell", available_cells())
def test_a_few_training_steps_with_every_registered_cell(cell):
    if cell in NOT_AN_ENCODER:
        pytest.skip(f"{cell}: {NOT_AN_ENCODER[cell]}")
    spec = get_cell(cell)
    modes = [("rnn", "encoder"), ("rnn", "encoder+decoder")]
    if spec.bidirectional:
        modes.append(("brnn", "encoder"))
    for encoder_type, cell_layers in modes:
        torch.manual_seed(0)
        task = _task(NMTModelConfig(word_vec_size=8, hidden_size=8, dropout=0.3,
                                    encoder_type=encoder_type, cell_layers=cell_layers))
        model = task.build_model(functools.partial(build_encoder, cell)).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        before = [p.detach().clone() for p in model.encoder.parameters()]
        batch = task.train_plan(0, torch.Generator().manual_seed(0))[0]
        first = None
        for _ in range(4):
            out = task.loss(model, batch, None)
            assert torch.isfinite(out.loss) and out.weight == batch["src"].shape[0]
            opt.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            first = float(out.loss.detach()) if first is None else first
        assert any(not torch.equal(b, p) for b, p in zip(before, model.encoder.parameters()))
        model.eval()
        with torch.no_grad():
            after = float(task.loss(model, batch, None).loss)
        assert after < first, (cell, encoder_type, cell_layers)


@pytest.fixture
def nmt_registered(monkeypatch):
    """The nmt task under its entry-point name (until pyproject.toml lists it)."""
    from lstmablate import task as core

    eps = core._entry_points()
    if "nmt" not in eps:
        class EntryPoint:
            name = "nmt"

            def load(self):
                return NMTTask

        monkeypatch.setattr(core, "_entry_points", lambda: {**eps, "nmt": EntryPoint()})


def test_a_run_through_the_trainer(nmt_registered, tmp_path):
    from lstmablate.run.runner import evaluate_run, train_run

    sets = ["data.verify=false", "model.word_vec_size=16", "model.hidden_size=16",
            "train.max_epochs=2", "eval.beam_size=2", "eval.max_length=12"]
    out = train_run("nmt", "lstm-srnn", overrides=sets, out=tmp_path, experiment="nmt-tiny",
                    data_dir=str(FIXTURES), threads=1)
    run = tmp_path / "nmt-tiny" / "lstm-srnn" / "seed-1"
    result = json.loads(RunFiles(run).result.read_text())
    assert set(result["test"]) >= {"bleu", "sacrebleu"}
    assert json.loads((RunFiles(run).artefacts / "tgt_vocab.json").read_text())[:4] == [
        "<unk>", "<blank>", "<s>", "</s>"]
    lines = [json.loads(x) for x in RunFiles(run).metrics.read_text().splitlines()]
    assert [r["split"] for r in lines] == ["val", "val"] and all("ppl" in r for r in lines)
    assert out.result is not None
    # `lstmablate eval --split test` with the run's final checkpoint gives the same numbers
    again = evaluate_run(run, split="test", checkpoint="last", data_dir=str(FIXTURES))
    assert again["bleu"] == pytest.approx(result["test"]["bleu"])
    preds = tmp_path / "pred.de"
    from_file = evaluate_run(run, split="test", checkpoint="last", data_dir=str(FIXTURES),
                             write_predictions=preds)
    assert from_file == again and len(preds.read_text(encoding="utf-8").splitlines()) == 10


def test_the_recipes_resolve():
    from lstmablate.recipes import load_recipe, resolve_config

    for name, size, enc in (("nmt-multi30k", 500, "rnn"), ("nmt-multi30k-cpu", 256, "rnn"),
                            ("nmt-multi30k-brnn", 500, "brnn"),
                            ("nmt-multi30k-cpu-brnn", 256, "brnn")):
        lstm = resolve_config(NMTTask, "lstm", recipe=name)
        gates = resolve_config(NMTTask, "lstm-gates", recipe=name)
        assert (lstm.model.hidden_size, lstm.model.word_vec_size) == (size, size)
        assert lstm.model.encoder_type == enc
        # OpenNMT-py master's decoding, the length-normalised ranking recorded beside it
        assert (lstm.eval.length_normalise, lstm.eval.eos_stop, lstm.eval.replace_unk) == (
            False, True, True)
        assert lstm.eval.also_length_normalised and lstm.eval.max_length == 100
        assert lstm.train.lr == 1.0 and gates.train.lr == 0.1  # Levy et al. footnote 2
        assert (lstm.train.decay_start, lstm.train.max_epochs, lstm.train.clip_norm) == (8, 13, 5.0)
        assert lstm.model.cell_layers == "encoder" and lstm.eval.beam_size == 5
        assert lstm.train.test_checkpoint == "last"
    _, spec = load_recipe("table4")
    assert spec["table"]["experiments"] == ["nmt-multi30k"]
    assert spec["table"]["metrics"] == ["bleu", "sacrebleu", "lennorm_bleu"]


def test_the_brnn_recipe_builds_openNMT_brnn_encoder():
    """``nmt-multi30k-brnn`` is ``nmt-multi30k`` with OpenNMT-py's ``-encoder_type brnn``
    (onmt/Models.py @ 18d3d2e1): -rnn_size 500 split into 250 per direction over 2 layers, the
    outputs the two directions concatenated, and the decoder started from each layer's forward
    and backward final states concatenated (``_fix_enc_hidden``), not from zeros."""
    from lstmablate.recipes import resolve_config

    uni = resolve_config(NMTTask, "lstm", recipe="nmt-multi30k")
    bi = resolve_config(NMTTask, "lstm", recipe="nmt-multi30k-brnn")
    assert (uni.model.encoder_type, bi.model.encoder_type) == ("rnn", "brnn")
    assert {**vars(bi.model), "encoder_type": "rnn"} == vars(uni.model)  # nothing else differs
    assert (bi.train, bi.data, bi.eval) == (uni.train, uni.data, uni.eval)
    sizes = {}
    for cfg in (uni, bi):
        torch.manual_seed(0)
        model = _task(cfg.model).build_model(functools.partial(build_encoder, "lstm"))
        sizes[cfg.model.encoder_type] = sum(p.numel() for p in model.encoder.parameters())
    assert model.encoder.bidirectional and model.encoder.output_size == 500
    # per direction and layer 4 x 250 x (500 + 250) weights and one bias of 4 x 250; torch's
    # nn.LSTM (OpenNMT's) has a second, recurrent bias vector per direction and layer
    assert sizes == {"rnn": 4_004_000, "brnn": 3_004_000}
    reference = torch.nn.LSTM(500, 250, num_layers=2, bidirectional=True)
    assert sizes["brnn"] == sum(p.numel() for p in reference.parameters()) - 2 * 2 * 4 * 250
    # the decoder's initial state: [forward; backward] final state of each encoder layer
    src, lengths = torch.tensor([[4, 5, 6], [7, 4, 1]]), torch.tensor([3, 2])
    model.eval()
    with torch.no_grad():
        mem = model.encode(src, lengths)
        h = model.init_decoder(mem).rnn[0]
    final_h = mem.enc_state[0]  # (layers * directions, B, 250): layer 0 fwd, layer 0 bwd, ...
    assert mem.memory.shape == (2, 3, 500) and h.shape == (2, 2, 500)
    assert torch.equal(h, torch.cat([final_h[0::2], final_h[1::2]], dim=2))
    # the top layer's forward state is its output at the last word, the backward at the first
    assert torch.equal(h[-1, 1, :250], mem.memory[1, 1, :250])
    assert torch.equal(h[-1, 1, 250:], mem.memory[1, 0, 250:])


def test_visualization_inputs_are_the_encoder_and_its_embedded_tokens(overfit):
    task, model, _ = overfit
    enc, x, labels = task.visualization_inputs(model, "A man rides a zorblax-bike.")
    assert enc is model.encoder and x.shape == (1, len(labels), 32)
    assert labels == ["A", "man", "rides (<unk>)", "a", "zorblax (<unk>)", "@-@", "bike", "."]


def test_bad_config_values_are_named():
    from lstmablate.recipes import resolve_config
    from lstmablate.errors import ConfigError

    for override, match in (("model.encoder_type=bilstm", "model.encoder_type must be one of rnn, brnn"),
                            ("model.cell_layers=decoder", "model.cell_layers must be one of"),
                            ("data.tgt_lang=en", "both 'en'"),
                            ("data.src_lang=fr", "data.src_lang must be one of en, de"),
                            ("model.hidden_size=7", "7 is odd"),
                            ("eval.beam_size=0", "eval.beam_size must be >= 1"),
                            ("eval.also_length_normalised=true", "raw ranking"),
                            ("eval.beam_size=1", "needs the first decoding to be a beam")):
        sets = [override] + (["model.encoder_type=brnn"] if "hidden_size" in override else [])
        if override.startswith("eval.also"):
            sets.append("eval.length_normalise=true")
        elif override == "eval.beam_size=1":
            sets.append("eval.also_length_normalised=true")
        with pytest.raises(ConfigError, match=match):
            resolve_config(NMTTask, "lstm", overrides=sets)
