"""SQuAD reading (errors name the file and question), the dev-by-article stand-in split, and
the tokenizer's character offsets (every answer of the real dev file)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.squad.data import load_split, parse_squad, read_squad
from lstmablate_tasks.squad.examples import choose_target
from lstmablate_tasks.squad.tokenizer import (Tokenizer, char_span_to_tokens, covering_tokens,
                                              span_text)

FIXTURE = Path(__file__).parent / "fixtures" / "squad"


def _doc(answer_start=0, **qa_extra):
    qa = {"id": "q-7", "question": "Who?", "answers": [{"text": "Ann", "answer_start": answer_start}]}
    qa.update(qa_extra)
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "Ann met Bob.", "qas": [qa]}]}]}


def test_parse_good_document():
    arts = parse_squad(json.dumps(_doc()), Path("x.json"))
    (q,) = arts[0].paragraphs[0].questions
    assert q.qid == "q-7" and q.answers[0].text == "Ann" and q.answers[0].end == 3


def test_bad_json_names_file_and_line():
    with pytest.raises(DataError, match=r"bad.json, line 2: not valid JSON"):
        parse_squad('{"data": [\n  oops]}', Path("bad.json"))


def test_missing_field_names_question_id():
    doc = _doc()
    del doc["data"][0]["paragraphs"][0]["qas"][0]["question"]
    with pytest.raises(DataError, match=r"f.json: question 'q-7' .* has no field 'question'"):
        parse_squad(json.dumps(doc), Path("f.json"))
    doc = _doc()
    del doc["data"][0]["paragraphs"][0]["qas"][0]["id"]
    with pytest.raises(DataError, match=r"article 0 \('T'\), paragraph 0, question 0 has no field 'id'"):
        parse_squad(json.dumps(doc), Path("f.json"))


def test_wrong_type_and_misplaced_answer():
    with pytest.raises(DataError, match=r"field 'answer_start' of answer 0 of question 'q-7'.* must be int"):
        parse_squad(json.dumps(_doc(answer_start="0")), Path("f.json"))
    with pytest.raises(DataError, match=r"answer 0 of question 'q-7'.*'Ann', is not at its "
                                        r"answer_start 4 .*found 'met'"):
        parse_squad(json.dumps(_doc(answer_start=4)), Path("f.json"))
    doc = _doc()
    doc["data"][0]["paragraphs"][0]["qas"].append(dict(doc["data"][0]["paragraphs"][0]["qas"][0]))
    with pytest.raises(DataError, match="question id 'q-7' occurs twice"):
        parse_squad(json.dumps(doc), Path("f.json"))


def test_read_gzip_file(tmp_path):
    p = tmp_path / "dev-v1.1.json.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        json.dump(_doc(), f)
    assert read_squad(p)[0].title == "T"


def test_standin_split_by_article_on_fixture():
    train = load_split(FIXTURE, "dev-by-article", "train", 1)
    dev = load_split(FIXTURE, "dev-by-article", "dev", 1)
    assert [a.title for a in train] == ["Normans"] and [a.title for a in dev] == ["Force"]
    with pytest.raises(DataError, match="standin_dev_articles=2 does not split the 2 articles"):
        load_split(FIXTURE, "dev-by-article", "dev", 2)


@pytest.mark.parametrize("text, tokens", [
    ("Mr. Smith don't know U.S. law.", ["Mr.", "Smith", "do", "n't", "know", "U.S.", "law", "."]),
    ("It cost $3.5 million (1,000 units) at 12:30...",
     ["It", "cost", "$", "3.5", "million", "(", "1,000", "units", ")", "at", "12:30", "..."]),
    ("Denver-based state-of-the-art", ["Denver", "-", "based", "state", "-", "of", "-", "the",
                                       "-", "art"]),
    ("“Quoted” — they're here", ["“", "Quoted", "”", "—", "they", "'re", "here"]),
    ("cannot Zürich naïve", ["can", "not", "Zürich", "naïve"]),
])
def test_tokenizer_rules(text, tokens):
    toks = Tokenizer().tokenize(text)
    assert [t.text for t in toks] == tokens
    assert all(text[t.start:t.end] == t.text for t in toks)


def test_tokenizer_keeps_hyphenated_words_when_asked():
    assert [t.text for t in Tokenizer(split_hyphens=False).tokenize("Denver-based")] == ["Denver-based"]


def test_answer_spans_and_targets():
    text = "The Denver Broncos beat the Carolina Panthers."
    toks = Tokenizer().tokenize(text)
    assert char_span_to_tokens(toks, 4, 18) == (1, 2)  # "Denver Broncos"
    assert span_text(text, toks, 1, 2) == "Denver Broncos"
    assert char_span_to_tokens(toks, 5, 18) is None     # starts inside a token
    assert covering_tokens(toks, 5, 18) == (1, 2)
    assert choose_target([(1, 2), (3, 4), (3, 4)], "first") == (1, 2)
    assert choose_target([(1, 2), (3, 4), (3, 4)], "most_common") == (3, 4)
    assert choose_target([], "first") is None


def test_offsets_round_trip_every_dev_answer(real_data_dir):
    """Every token is its exact original characters; every answer of dev-v1.1.json is found
    again through the token offsets: the tokens covering it give back original text that
    holds the answer at its offset, and for all but a few the answer is exactly a token span
    (measured: 95 of 34,726 are not, because the annotation cuts a token — "U.S" of "U.S.",
    "gold" of "golden", "28" of "11:28" — and those are scored on text, never on tokens)."""
    from lstmablate.data import find_file

    try:
        path = find_file(real_data_dir, "squad/dev-v1.1.json")
    except DataError:
        pytest.skip("squad/dev-v1.1.json is not in the data directory")
    articles = read_squad(path)
    tokenizer = Tokenizer()
    n_answers = exact = n_questions = trainable = 0
    for art in articles:
        for par in art.paragraphs:
            tokens = tokenizer.tokenize(par.context)
            assert all(par.context[t.start:t.end] == t.text for t in tokens)
            for q in par.questions:
                n_questions += 1
                trainable += any(char_span_to_tokens(tokens, a.start, a.end) for a in q.answers)
                for a in q.answers:
                    n_answers += 1
                    first, last = covering_tokens(tokens, a.start, a.end)
                    covered = span_text(par.context, tokens, first, last)
                    offset = a.start - tokens[first].start
                    assert covered[offset:offset + len(a.text)] == a.text, (q.qid, a.text)
                    span = char_span_to_tokens(tokens, a.start, a.end)
                    if span is not None:
                        assert span == (first, last) and covered == a.text
                        exact += 1
    assert n_answers == 34726  # the answers of SQuAD v1.1 dev
    assert n_answers - exact <= 100
    assert n_questions == 10570 and trainable == 10569  # one question has no exact span


def test_standin_split_of_the_real_dev_file(real_data_dir):
    """38 articles (8,582 questions) train, 10 (1,988) evaluate; no article or paragraph in both."""
    try:
        train = load_split(real_data_dir, "dev-by-article", "train", 10)
    except DataError:
        pytest.skip("squad/dev-v1.1.json is not in the data directory")
    dev = load_split(real_data_dir, "dev-by-article", "dev", 10)
    assert (len(train), len(dev)) == (38, 10)
    assert sum(a.n_questions for a in train) == 8582 and sum(a.n_questions for a in dev) == 1988
    assert not {a.title for a in train} & {a.title for a in dev}
    assert not {p.context for a in train for p in a.paragraphs} & \
        {p.context for a in dev for p in a.paragraphs}
