"""SQuAD v1.1 EM/F1 against the official evaluation script's definitions, on hand-computed
cases (normalisation order, punctuation, articles, whitespace, duplicates, several golds)."""

from __future__ import annotations

import json

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.squad.metrics import (exact_match_score, f1_score, max_over_gold,
                                            normalize_answer, read_predictions, score_predictions)


@pytest.mark.parametrize("raw, normalised", [
    # lower -> strip ASCII punctuation -> drop a/an/the -> collapse whitespace
    ("The  Quick, Brown-Fox!", "quick brownfox"),
    ("an apple a day at the theatre", "apple day at theatre"),  # only whole words a/an/the
    ("Denver's", "denvers"),
    ("the-end", "theend"),       # punctuation goes first, so "the" is no longer a word
    ("The, end", "end"),
    ("  \tA\n", ""),             # an article alone normalises to the empty string
    ("“Broncos”", "“broncos”"),  # curly quotes are not in string.punctuation: kept
    ("ÉCOLE Normale", "école normale"),
])
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match():
    assert exact_match_score("The Denver Broncos.", "denver broncos")
    assert not exact_match_score("Denver Broncos", "Broncos")
    assert not exact_match_score("“Broncos”", "Broncos")
    assert exact_match_score("", "the")  # both normalise to ""


def test_f1_hand_computed():
    # [denver, broncos, win] vs [denver, broncos]: P = 2/3, R = 1, F1 = 2PR/(P+R) = 0.8
    assert f1_score("Denver Broncos win", "the Denver Broncos") == pytest.approx(0.8)
    # multiset overlap: [cat, cat, cat] vs [cat, cat]: common 2, P = 2/3, R = 1 -> 0.8
    assert f1_score("the the cat cat cat", "cat cat") == pytest.approx(0.8)
    # P = 1/2, R = 1/3: F1 = 2 * (1/6) / (5/6) = 0.4
    assert f1_score("Carolina Panthers", "the Panthers of North") == pytest.approx(0.4)
    assert f1_score("", "the") == 0.0  # nothing in common -> 0, even though EM is 1
    assert f1_score("Broncos", "Panthers") == 0.0


def test_max_over_gold_answers():
    golds = ["Santa Clara", "Levi's Stadium", "Santa Clara, California."]
    assert max_over_gold(exact_match_score, "Santa Clara, California", golds) == 1.0
    assert max_over_gold(f1_score, "Santa Clara, CA", golds) == pytest.approx(0.8)
    assert max_over_gold(f1_score, "Levis", golds) == pytest.approx(2 * 0.5 / 1.5)


def test_score_predictions_averages_and_unanswered():
    gold = [("q1", ["Denver Broncos"]), ("q2", ["the Denver Broncos"]), ("q3", ["Super Bowl"])]
    preds = {"q1": "the Denver Broncos", "q2": "Denver Broncos win", "extra": "ignored"}
    m = score_predictions(gold, preds)
    assert m["em"] == pytest.approx(100 * (1 + 0 + 0) / 3)
    assert m["f1"] == pytest.approx(100 * (1 + 0.8 + 0) / 3)
    assert m["questions"] == 3 and m["unanswered"] == 1


def test_read_predictions(tmp_path):
    p = tmp_path / "preds.json"
    p.write_text(json.dumps({"a": "x", "b": "ü"}, ensure_ascii=False), encoding="utf-8")
    assert read_predictions(p) == {"a": "x", "b": "ü"}
    p.write_text('{"a": "x",\n "b": }')
    with pytest.raises(DataError, match=r"preds.json, line 2: not valid JSON"):
        read_predictions(p)
    p.write_text('{"a": 3}')
    with pytest.raises(DataError, match="question 'a' must be a string"):
        read_predictions(p)
    p.write_text('["x"]')
    with pytest.raises(DataError, match="expected a JSON object"):
        read_predictions(p)
