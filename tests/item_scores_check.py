"""The per-task round trip of per-item scores (imported by each task's tests): the records of
``Task.evaluate_items``, written to a scores file and read back, recompute through
``Task.item_metrics`` the metrics the task itself reports (``evaluate(final=True)``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lstmablate.run.scores import read_scores, write_scores

#: float64 sums over at most ~1e5 items in another order: a few ulps per item at worst
FLOAT64_RTOL = 1e5 * np.finfo(np.float64).eps


def assert_round_trip(task, model, split: str, tmp_path: Path,
                      rtol: dict[str, float] | None = None) -> tuple[dict, list[dict]]:
    """Check the round trip for every metric the task recomputes; returns (metrics, records)."""
    rtol = rtol or {}
    metrics, records = task.evaluate_items(model, split)
    final = task.evaluate(model, split, final=True)
    assert set(final) == set(metrics)
    for k, v in final.items():  # the same evaluation
        assert metrics[k] == pytest.approx(v, rel=FLOAT64_RTOL, nan_ok=True), k
    assert records, "no records"
    assert len({json.dumps(r["id"]) for r in records}) == len(records), "ids are not unique"
    reference = task.reference_items(split)  # its digest tells two runs' test sets apart
    assert reference is not None, "the task gives no gold items for the scores file's digest"
    assert len(reference) == len(records) and all(isinstance(x, str) for x in reference)
    path = tmp_path / f"scores-{split}.jsonl"
    write_scores(path, {"task": task.name, "experiment": "x", "cell": "lstm", "seed": 1,
                        "split": split, "checkpoint": "best", "metrics": metrics}, records)
    back = read_scores(path)
    assert back.records == json.loads(json.dumps(records))  # JSON keeps every statistic
    assert back.header["items"] == len(records) and back.metrics == metrics
    recomputed = task.item_metrics()
    assert recomputed, "the task recomputes no metric"
    for name, metric in recomputed.items():
        want = metrics[name]
        got = metric.of(back.records)
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got), name
        else:
            assert got == pytest.approx(want, rel=rtol.get(name, FLOAT64_RTOL), abs=1e-12), name
        keys = {json.dumps(task.item_key(r), default=str) for r in back.records}
        assert len(keys) == len(records)
    return metrics, records
