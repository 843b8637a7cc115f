"""Exact match and F1 exactly as the official SQuAD v1.1 evaluation script defines them.

(``evaluate-v1.1.py`` from the SQuAD explorer; AllenNLP and DrQA carry copies of it.)

* normalise an answer: lower-case -> delete every ASCII punctuation character
  (``string.punctuation``) -> replace the words ``a``, ``an``, ``the`` by a space ->
  collapse whitespace (split / join with one space);
* EM of a prediction against one gold answer: the two normalised strings are equal;
* F1: over the whitespace tokens of the normalised strings, with
  ``common`` = the multiset intersection, precision = common / len(prediction),
  recall = common / len(gold), F1 = 2PR / (P + R), and 0 when nothing is in common
  (so an empty prediction scores F1 0 even against an answer that normalises to empty);
* per question the maximum over its gold answers; a question without a prediction scores 0;
* the averages over all questions of the dataset, times 100.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from lstmablate.errors import DataError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """lower -> strip punctuation -> strip articles -> collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def max_over_gold(metric, prediction: str, golds: Sequence[str]) -> float:
    return max(float(metric(prediction, g)) for g in golds)


def score_predictions(gold: Iterable[tuple[str, Sequence[str]]],
                      predictions: Mapping[str, str]) -> dict[str, float]:
    """``em`` and ``f1`` (percent) of ``predictions`` ({question id: answer text}) over the
    questions ``gold`` ((id, gold answer texts) for every question of the split, in any
    order); ``questions`` counted and ``unanswered`` (questions without a prediction, which
    score 0 as in the official script)."""
    em = f1 = 0.0
    total = unanswered = 0
    for qid, golds in gold:
        total += 1
        if qid not in predictions:
            unanswered += 1
            continue
        em += max_over_gold(exact_match_score, predictions[qid], golds)
        f1 += max_over_gold(f1_score, predictions[qid], golds)
    if total == 0:
        raise ValueError("no questions to score")
    return {"em": 100.0 * em / total, "f1": 100.0 * f1 / total, "questions": float(total),
            "unanswered": float(unanswered)}


def read_predictions(path: Path) -> dict[str, str]:
    """An official SQuAD prediction file: one JSON object {question id: answer text}."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read the predictions file {path}: {e.strerror or e}.") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; expected a SQuAD predictions JSON file.") from None
    try:
        preds = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                        "expected a SQuAD predictions file {question id: answer text}.") from None
    if not isinstance(preds, dict):
        raise DataError(f"{path}: expected a JSON object {{question id: answer text}}, got "
                        f"{type(preds).__name__}.")
    for qid, ans in preds.items():
        if not isinstance(ans, str):
            raise DataError(f"{path}: the prediction for question {qid!r} must be a string, got "
                            f"{type(ans).__name__} ({ans!r:.60}).")
    return preds
