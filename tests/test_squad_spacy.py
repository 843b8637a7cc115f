"""SQuAD tokenised with spaCy as the originals: exact character offsets over the whole dev file,
AllenNLP's answer spans, DrQA's lemma / POS / NER features from a (stub) spaCy pipeline, and a
clear message without spaCy."""

from __future__ import annotations

import sys

import pytest
import torch

from lstmablate.errors import DataError, UserError
from lstmablate_tasks.squad.data import read_squad
from lstmablate_tasks.squad.features import FEATURES
from lstmablate_tasks.squad.tokenizer import (SpacyTokenizer, Token, allennlp_token_span,
                                              char_span_to_tokens, make_tokenizer)

spacy = pytest.importorskip("spacy")

from test_squad_drqa import make_model, make_task  # noqa: E402


def test_spacy_tokens_keep_their_characters():
    text = "The\u00a0Broncos  beat\nthe Panthers 24–10 in Santa Clara's stadium."
    drqa = SpacyTokenizer(clean_spaces=True, keep_space=True)  # hitvoice/DrQA
    bidaf = SpacyTokenizer(clean_spaces=False, keep_space=False)  # AllenNLP
    for tok in (drqa, bidaf):
        tokens = tok.tokenize(text)
        assert all(text[t.start:t.end] == t.text for t in tokens)
    words = [t.text for t in bidaf.tokenize(text)]
    assert "Clara" in words and "'s" in words and words[-1] == "."
    assert not any(w.isspace() for w in words)  # AllenNLP drops spaCy's whitespace tokens
    assert any(t.text.isspace() for t in drqa.tokenize(text))  # hitvoice keeps them


def test_allennlp_spans_cover_an_answer_that_cuts_a_token():
    text = "the golden anniversary in 1854-1855"
    toks = [Token(w, text.index(w), text.index(w) + len(w))
            for w in ("the", "golden", "anniversary", "in", "1854-1855")]
    assert allennlp_token_span(toks, 4, 10) == (1, 1) == char_span_to_tokens(toks, 4, 10)
    assert char_span_to_tokens(toks, 4, 8) is None
    assert allennlp_token_span(toks, 4, 8) == (1, 1)  # "gold" of "golden": the whole token
    assert allennlp_token_span(toks, 6, 18) == (1, 2)  # starts inside "golden": back one
    assert allennlp_token_span(toks, 26, 30) == (4, 4)  # "1854" of "1854-1855"
    assert allennlp_token_span(toks, 3, 10) == (0, 1)  # starts on the space: the token before
    assert allennlp_token_span([], 0, 1) is None


@pytest.mark.slow  # about 20 s: the dev file tokenised twice
def test_every_dev_answer_maps_to_tokens_with_spacy(real_data_dir):
    """The whole SQuAD v1.1 dev file through spaCy's tokenizer as each reader uses it: every
    token is its exact characters, every gold answer has a token span (AllenNLP's covering
    span); the answers that are not exactly a token span are counted (docs/squad.md)."""
    from lstmablate.data import find_file

    try:
        path = find_file(real_data_dir, "squad/dev-v1.1.json")
    except DataError:
        pytest.skip("squad/dev-v1.1.json is not in the data directory")
    articles = read_squad(path)
    for tokenizer in (make_tokenizer("spacy", clean_spaces=True, keep_space=True),
                      make_tokenizer("spacy", clean_spaces=False, keep_space=False)):
        n_answers = misaligned = 0
        for art in articles:
            for par in art.paragraphs:
                tokens = tokenizer.tokenize(par.context)
                assert all(par.context[t.start:t.end] == t.text for t in tokens)
                words = [t for t in tokens if not t.text.isspace()]
                for q in par.questions:
                    for a in q.answers:
                        n_answers += 1
                        first, last = allennlp_token_span(words, a.start, a.end)
                        covered = par.context[words[first].start:words[last].end]
                        assert a.text.strip() in covered, (q.qid, a.text)
                        misaligned += char_span_to_tokens(words, a.start, a.end) is None
        assert n_answers == 34726
        print(f"\n{tokenizer}: {misaligned} of {n_answers} answers are not exactly a token span")
        assert misaligned < 0.02 * n_answers


# -- DrQA's tagger features from a spaCy pipeline ----------------------------------------------
@spacy.Language.component("lstmablate_stub_tagger")
def stub_tagger(doc):
    """Stands in for en_core_web_md's tagger, lemmatizer and NER: capitalised words are NNP and
    a PERSON entity, the rest XX; the lemma is the lower-cased word without a final s."""
    for t in doc:
        t.tag_ = "NNP" if t.text[:1].isupper() else "XX"
        t.lemma_ = t.text.lower().removesuffix("s")
    doc.ents = [spacy.tokens.Span(doc, i, i + 1, label="PERSON")
                for i, t in enumerate(doc) if t.text[:1].isupper()]
    return doc


@pytest.fixture
def stub_pipeline(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("lstmablate_stub_tagger")
    path = tmp_path / "stub_pipeline"
    nlp.to_disk(path)
    return path


def test_drqa_lemma_pos_ner_features_from_a_pipeline(stub_pipeline):
    task = make_task(data={"tagger": str(stub_pipeline)}, model={"features": list(FEATURES)})
    assert task.artefacts["features"] == list(FEATURES)
    assert set(task.pos_tags) == {"NNP", "XX"} and set(task.ner_tags) == {"PERSON", ""}
    ex = task.examples["train"]
    q = ex.questions[0]
    par = ex.paragraphs[q.paragraph]
    assert all(t.tag in ("NNP", "XX") and t.lemma for t in par.tokens)
    batch = task.collate(ex, [0])
    feats = batch["doc_feats"][0, :len(par.tokens)]
    assert feats.shape[1] == 4 + len(task.pos_tags) + len(task.ner_tags)
    q_lemmas = {t.text.lower().removesuffix("s") for t in q.tokens}
    for i, t in enumerate(par.tokens):
        em_cased, em_uncased, em_lemma, tf = feats[i, :4].tolist()
        assert em_cased == float(t.text in {u.text for u in q.tokens})
        assert em_lemma == float(t.text.lower().removesuffix("s") in q_lemmas)
        pos = feats[i, 4:4 + len(task.pos_tags)]
        ner = feats[i, 4 + len(task.pos_tags):]
        assert pos.sum() == 1 and task.pos_tags[int(pos.argmax())] == t.tag
        assert ner.sum() == 1 and task.ner_tags[int(ner.argmax())] == t.ent
        assert t.ent == ("PERSON" if t.text[:1].isupper() else "")
    model = make_model(task)  # the encoder reads every feature column
    start, end = task.span_scores(model, batch)
    assert start.shape == batch["doc_ids"].shape and torch.isfinite(start[0, :len(par.tokens)]).all()
    # the report says which of DrQA's features a run went without
    from lstmablate.config import config_from_dict
    from lstmablate.run.runs import RunFiles
    from lstmablate_tasks.squad.task import DrQATask

    def saved(features):  # a run's config as report reads it: typed
        return config_from_dict(DrQATask, {
            "task": DrQATask.name, "cell": "lstm", "experiment": "e", "seed": 1,
            "data": {"tokenizer": "spacy"}, "model": {"pretrained": "x", "features": features}},
            RunFiles.CONFIG)

    assert DrQATask.run_deviations(saved(list(FEATURES))) == []
    assert DrQATask.run_deviations(saved(["em_cased", "em_uncased", "tf"])) == [
        "without DrQA's features em_lemma, pos, ner"]


def test_without_spacy_the_message_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # `import spacy` now fails
    with pytest.raises(UserError, match=r"spaCy is not installed.*pip install spacy.*"
                                        r"data\.tokenizer=regex"):
        make_task()
    task = make_task(data={"tokenizer": "regex"})  # the documented fallback works without it
    assert task.examples["train"].questions


def test_a_missing_pipeline_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"data\.tagger=.*cannot load.*model\.features="):
        make_task(data={"tagger": str(tmp_path / "no_such_pipeline")},
                  model={"features": list(FEATURES)})
