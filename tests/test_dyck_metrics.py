"""Tests for the bracket-closing criterion and the WCPA aggregates."""

from __future__ import annotations

import math

import pytest
import torch

from lstmablate_tasks.dyck.generator import generate
from lstmablate_tasks.dyck.language import END_ID, DyckVocab, stack_annotations
from lstmablate_tasks.dyck.metrics import BracketClosingMeter, bracket_closing_judgements

V2 = DyckVocab(2)


def enc(text: str) -> list[int]:
    return V2.encode(text.split())


def automaton_probs(
    seqs: list[list[int]], k: int, m: int, pad_to: int | None = None
) -> torch.Tensor:
    """The sampler's own next-token distribution at every position: a perfect "lm" model."""
    vocab = DyckVocab(k)
    steps = pad_to or max(map(len, seqs))
    probs = torch.zeros(len(seqs), steps, vocab.size, dtype=torch.float64)
    for b, seq in enumerate(seqs):
        after = stack_annotations(seq, k)
        for t in range(len(seq)):
            state = after[t - 1] if t > 0 else None
            depth = state.depth if state else 0
            if depth < m:
                for typ in range(k):
                    probs[b, t, vocab.open_id(typ)] = 1 / (2 * k)
            if depth == 0:
                probs[b, t, END_ID] = 1 / 2
            else:
                probs[b, t, vocab.close_id(state.top_type)] = 1 / 2 if depth < m else 1.0
    return probs


def close_probs(
    seqs: list[list[int]], k: int, p_gold: float, steps: int | None = None
) -> torch.Tensor:
    """(B, T, k) closing-type distributions putting ``p_gold`` on the right close, rest spread."""
    vocab = DyckVocab(k)
    probs = torch.full((len(seqs), steps or max(map(len, seqs)), k), 1 / k, dtype=torch.float64)
    for b, seq in enumerate(seqs):
        for t, tok in enumerate(seq):
            if vocab.is_close(tok):
                probs[b, t] = (1 - p_gold) / (k - 1)
                probs[b, t, vocab.bracket_type(tok)] = p_gold
    return probs


# ---------------------------------------------------------------------------------------------
# Distance convention


def test_distance_is_tokens_read_since_the_open_bracket():
    # "(a (b b) a) END": t=1 after "(a" -> d 0; t=2 after "(a (b" -> top (b at 1, d 0;
    # t=3 after "(a (b b)" -> top (a at 0, d 2; t=0 and t=4 have an empty stack: not judged.
    seq = enc("(a (b b) a) END")
    probs = automaton_probs([seq], 2, 3)
    d, correct = bracket_closing_judgements(probs, [seq], 2, "lm")
    assert d.tolist() == [0, 0, 2]
    assert correct.tolist() == [True, True, True]
    # For the closing objective only the two closes are judged, at the same distances.
    d, _ = bracket_closing_judgements(close_probs([seq], 2, 1.0), [seq], 2, "close")
    assert d.tolist() == [0, 2]
    short = enc("(a a) END")
    d, _ = bracket_closing_judgements(close_probs([short], 2, 1.0), [short], 2, "close")
    assert d.tolist() == [0]


def test_lm_judges_every_nonempty_stack_position_whatever_the_gold_token():
    seq = enc("(a (a (b b) a) (b b) a) END")
    probs = automaton_probs([seq], 2, 3)
    d, _ = bracket_closing_judgements(probs, [seq], 2, "lm")
    # 9 tokens; the stack is non-empty before positions 1..7, whose gold tokens are opens as
    # well as closes; it is empty before position 0 and before END (position 8).
    assert len(d) == 7
    assert d.tolist() == [0, 0, 0, 2, 4, 0, 6]


# ---------------------------------------------------------------------------------------------
# Perfect and uniform predictors


@pytest.mark.parametrize("k,m", [(2, 3), (3, 4)])
def test_perfect_lm_predictor_scores_100(k, m):
    seqs = generate(k, m, seed=4, min_length=1, max_length=80, num_sequences=60)
    meter = BracketClosingMeter(k, "lm")
    meter.update(automaton_probs(seqs, k, m).float(), seqs)
    out = meter.compute()
    assert out["wcpa_min"] == out["wcpa_mean"] == out["accuracy"] == 100.0
    expected = sum(sum(1 for s in stack_annotations(seq, k)[:-1] if s.depth > 0) for seq in seqs)
    assert out["n_judged"] == expected
    assert sum(row["total"] for row in out["per_distance"].values()) == expected
    assert max(out["per_distance"]) >= 10


def test_perfect_close_predictor_scores_100():
    seqs = generate(2, 4, seed=5, min_length=1, max_length=80, num_sequences=60)
    meter = BracketClosingMeter(2, "close")
    meter.update(close_probs(seqs, 2, 1.0), seqs)
    out = meter.compute()
    assert out["wcpa_min"] == out["wcpa_mean"] == out["accuracy"] == 100.0
    n_closes = sum(sum(V2.is_close(t) for t in seq) for seq in seqs)
    assert out["n_judged"] == n_closes


@pytest.mark.parametrize("objective", ["lm", "close"])
@pytest.mark.parametrize("k", [2, 5])
def test_uniform_predictor_scores_0(objective, k):
    seqs = generate(k, 3, seed=6, min_length=1, max_length=60, num_sequences=40)
    width = DyckVocab(k).size if objective == "lm" else k
    probs = torch.full((len(seqs), max(map(len, seqs)), width), 1 / width)
    meter = BracketClosingMeter(k, objective)
    meter.update(probs, seqs)
    out = meter.compute()
    assert out["n_judged"] > 100
    assert out["wcpa_min"] == out["wcpa_mean"] == out["accuracy"] == 0.0


# ---------------------------------------------------------------------------------------------
# A hand-computed mixture


def test_known_mixture_gives_hand_computed_scores():
    """Right at some positions, wrong at others; every number below is worked out by hand.

    Sequence 0 "(a (b b) a) END": judged (t, d) = (1, 0) (2, 0) (3, 2).
    Sequence 1 "(b (a (a a) a) b) END": judged (t, d) = (1, 0) (2, 0) (3, 0) (4, 2) (5, 4).
    The model is wrong at seq 0 t=2 and seq 1 t=3, t=5:
        d=0: 5 judged, 3 right -> 60 %;  d=2: 2 judged, 2 right -> 100 %;  d=4: 1 judged, 0 right.
        wcpa_min = 0, wcpa_mean = (60 + 100 + 0) / 3 = 53.33..., accuracy = 5 / 8 = 62.5 %.
    """
    seqs = [enc("(a (b b) a) END"), enc("(b (a (a a) a) b) END")]
    wrong = {(0, 2), (1, 3), (1, 5)}
    probs = automaton_probs(seqs, 2, 3, pad_to=9)
    a_close, b_close = V2.close_id(0), V2.close_id(1)
    for b, t in wrong:
        # Keep 0.3 on the right close but put 0.2 on the other one: ratio 0.6, below 0.8.
        right = int(probs[b, t, [a_close, b_close]].argmax()) + a_close
        other = a_close + b_close - right
        probs[b, t, right], probs[b, t, other] = 0.3, 0.2
    # A correct-but-hedged position: ratio 0.45 / (0.45 + 0.05) = 0.9 > 0.8 still counts.
    probs[1, 4, a_close], probs[1, 4, b_close] = 0.45, 0.05
    # Padding holds garbage that must be ignored.
    probs[0, 5:] = float("nan")
    probs[1, 7:] = float("nan")

    meter = BracketClosingMeter(2, "lm")
    meter.update(probs[:1], seqs[:1])  # two batches accumulate like one
    meter.update(probs[1:], seqs[1:])
    out = meter.compute()
    assert out["per_distance"] == {
        0: {"correct": 3, "total": 5, "accuracy": 60.0},
        2: {"correct": 2, "total": 2, "accuracy": 100.0},
        4: {"correct": 0, "total": 1, "accuracy": 0.0},
    }
    assert out["n_judged"] == 8 and out["n_buckets"] == 3
    assert out["wcpa_min"] == 0.0
    assert out["worst_distance"] == 4 and out["worst_judged"] == 1  # d=4: one judgement
    assert math.isclose(out["wcpa_mean"], 160 / 3)
    assert math.isclose(out["accuracy"], 62.5)
    # Dropping buckets with fewer than 2 judgements leaves d=0 and d=2.
    sparse = meter.compute(min_count=2)
    assert sparse["wcpa_min"] == 60.0 and sparse["wcpa_mean"] == 80.0 and sparse["n_buckets"] == 2
    assert sparse["worst_distance"] == 0 and sparse["worst_judged"] == 5
    assert math.isclose(sparse["accuracy"], 62.5)  # the micro average keeps every judgement

    meter.reset()
    assert meter.compute()["n_judged"] == 0 and math.isnan(meter.compute()["wcpa_min"])


def test_close_objective_mixture_and_strict_threshold():
    # "(a (b b) (a a) a) END": closes at t=2 (d 0), t=4 (d 0), t=5 (d 4).
    seq = enc("(a (b b) (a a) a) END")
    probs = close_probs([seq], 2, 0.95)
    probs[0, 4] = torch.tensor([0.8, 0.2], dtype=torch.float64)  # exactly 0.8: not > 0.8
    probs[0, 5] = torch.tensor([0.1, 0.9], dtype=torch.float64)  # confident and wrong
    meter = BracketClosingMeter(2, "close")
    meter.update(probs, [seq])
    out = meter.compute()
    assert {d: row["total"] for d, row in out["per_distance"].items()} == {0: 2, 4: 1}
    assert out["per_distance"][0]["accuracy"] == 50.0
    assert out["wcpa_min"] == 0.0 and out["wcpa_mean"] == 25.0
    assert math.isclose(out["accuracy"], 100 / 3)
    # With a threshold of 0.75 the 0.8 position counts.
    loose = BracketClosingMeter(2, "close", threshold=0.75)
    loose.update(probs, [seq])
    assert loose.compute()["per_distance"][0]["accuracy"] == 100.0


def test_no_close_mass_counts_as_wrong():
    seq = enc("(a a) END")
    probs = torch.zeros(1, 3, V2.size)
    probs[0, :, END_ID] = 1.0  # 0/0 ratio at t=1
    d, correct = bracket_closing_judgements(probs, [seq], 2, "lm")
    assert d.tolist() == [0] and correct.tolist() == [False]


def test_padded_id_tensor_equals_list_of_sequences():
    seqs = [enc("(a (b b) a) END"), enc("(b b) END")]
    padded = torch.zeros(2, 6, dtype=torch.long)
    for b, seq in enumerate(seqs):
        padded[b, : len(seq)] = torch.tensor(seq)
    probs = torch.rand(2, 6, V2.size, generator=torch.Generator().manual_seed(0))
    from_list = bracket_closing_judgements(probs, seqs, 2, "lm")
    from_tensor = bracket_closing_judgements(probs, padded, 2, "lm")
    assert from_list[0].tolist() == from_tensor[0].tolist()
    assert from_list[1].tolist() == from_tensor[1].tolist()


def test_bad_shapes_and_objectives_are_rejected():
    seq = enc("(a a) END")
    with pytest.raises(ValueError, match="probs must be"):
        bracket_closing_judgements(torch.rand(1, 3, 2), [seq], 2, "lm")
    with pytest.raises(ValueError, match="probs must be"):
        bracket_closing_judgements(torch.rand(1, 3, V2.size), [seq], 2, "close")
    with pytest.raises(ValueError, match="time steps"):
        bracket_closing_judgements(torch.rand(1, 2, V2.size), [seq], 2, "lm")
    with pytest.raises(ValueError, match="objective"):
        BracketClosingMeter(2, "bogus")  # type: ignore[arg-type]


# -- per-string scores (scores/test.jsonl) -------------------------------------------------------
EPOCHS = {"lm": 7, "close": 6}  # enough for right and wrong judgements


@pytest.mark.parametrize("objective, min_count", [("lm", 1), ("close", 1), ("lm", 3)])
def test_per_string_scores_recompute_wcpa_accuracy_and_loss(objective, min_count, tmp_path):
    """Round trip: per-distance judgement counts and the cross-entropy of every test string,
    summed, give the task's WCPA (min and mean, sparse buckets left out), accuracy and loss; a
    model trained briefly has right and wrong judgements, so the numbers are not trivial."""
    import functools

    from lstmablate.cells import build_encoder
    from lstmablate_tasks.dyck.task import DyckData, DyckEval, DyckModel, DyckTask

    from item_scores_check import assert_round_trip

    task = DyckTask(DyckData(k=2, m=3, objective=objective, train_tokens=0, train_sequences=64,
                             dev_sequences=8, test_sequences=24, train_max_length=12),
                    DyckModel(hidden_size=6), tmp_path, eval_cfg=DyckEval(min_bucket_count=min_count))
    task.setup()
    torch.manual_seed(0)
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(EPOCHS[objective]):
        for batch in task.train_plan(epoch, torch.Generator().manual_seed(epoch)):
            opt.zero_grad()
            task.loss(model, batch, None).loss.backward()
            opt.step()
    model.eval()
    # the loss is summed in float32 per batch by the task and per string here
    metrics, records = assert_round_trip(task, model, "test", tmp_path,
                                         rtol={"loss": 100 * torch.finfo(torch.float32).eps})
    assert 0 < metrics["accuracy"] < 100
    judged = sum(n for r in records for _, n, _ in r["judged"])
    meter = BracketClosingMeter(2, objective)
    for r in records:
        meter.add([d for d, n, _ in r["judged"] for _ in range(n)],
                  [i < c for d, n, c in r["judged"] for i in range(n)])
    assert meter.compute()["n_judged"] == judged
    assert meter.compute(min_count)["wcpa_min"] == pytest.approx(metrics["wcpa_min"])
    assert [r["targets"] for r in records] == [
        len(s) if objective == "lm" else sum(DyckVocab(2).is_close(t) for t in s)
        for s in task.splits["test"]]


def test_wcpa_from_summed_bucket_counts_by_hand():
    """Two strings' counts: distance 0 holds 3 judgements (2 right), distance 2 one (wrong)."""
    from lstmablate_tasks.dyck.task import DyckData, DyckEval, DyckModel, DyckTask

    records = [{"id": 0, "nll": 1.0, "targets": 4, "judged": [[0, 2, 2]]},
               {"id": 1, "nll": 3.0, "targets": 4, "judged": [[0, 1, 0], [2, 1, 0]]}]
    for min_count, wmin, wmean in ((1, 0.0, (200 / 3) / 2), (2, 200 / 3, 200 / 3)):
        task = DyckTask(DyckData(), DyckModel(), ".", eval_cfg=DyckEval(min_bucket_count=min_count))
        m = {k: v.of(records) for k, v in task.item_metrics().items()}
        assert m["wcpa_min"] == pytest.approx(wmin) and m["wcpa_mean"] == pytest.approx(wmean)
        assert m["accuracy"] == pytest.approx(50.0) and m["loss"] == 0.5
