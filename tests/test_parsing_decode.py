"""Tree decoding: Parser-v1's heuristic and Chu-Liu/Edmonds MST, on hand-built and random scores."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lstmablate_tasks.parsing.decode import (decode_heads, is_tree, mst_heads, parser_v1_heads,
                                             parser_v1_rels, tarjan_sccs, tree_score)

NEG = -np.inf


def log_softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


def brute_force(scores: np.ndarray) -> tuple[float, list[int]]:
    """The best tree with one root by enumerating every head assignment."""
    n = scores.shape[0] - 1
    best = None
    for hs in itertools.product(range(n + 1), repeat=n):
        heads = [0, *hs]
        if any(heads[i] == i for i in range(1, n + 1)) or not is_tree(heads):
            continue
        score = tree_score(scores, heads)
        if best is None or score > best[0]:
            best = (score, heads)
    return best


def test_is_tree():
    assert is_tree([0, 0])
    assert is_tree([0, 2, 0, 2])
    assert not is_tree([0, 0, 0])  # two roots
    assert not is_tree([0, 2, 1])  # no root, cycle
    assert not is_tree([0, 0, 3, 2])  # a cycle beside the root
    assert not is_tree([0, 1])  # self-loop


def test_tarjan_finds_the_cycles_of_a_head_graph():
    # 1 <- 0; 2 <-> 3; 4 -> 5 -> 6 -> 4; 7 hangs under 3
    heads = np.array([0, 0, 3, 2, 6, 4, 5, 3])
    sccs = tarjan_sccs(heads)
    assert sorted(c for c in sccs if len(c) > 1) == [[2, 3], [4, 5, 6]]
    assert sorted(x for c in sccs for x in c) == list(range(8))


@pytest.mark.parametrize("decoder", ["parser-v1", "mst"])
def test_random_score_matrices_always_give_one_rooted_tree(decoder):
    rng = np.random.default_rng(0)
    for trial in range(400):
        n = int(rng.integers(1, 30))
        scale = float(rng.choice([0.1, 1.0, 10.0]))
        scores = log_softmax(rng.normal(size=(n + 1, n + 1)) * scale)
        if trial % 4 == 0:  # adversarial: every word prefers ROOT
            scores[:, 0] += 20
        elif trial % 4 == 1:  # every word prefers the next one: one long cycle, no root
            for i in range(1, n + 1):
                scores[i, i % n + 1] += 20
        heads = decode_heads(scores, decoder)
        assert heads[0] == 0 and len(heads) == n + 1
        assert is_tree(heads), (decoder, n, heads.tolist())


def test_mst_equals_brute_force_on_small_sentences():
    rng = np.random.default_rng(1)
    for _ in range(250):
        n = int(rng.integers(1, 6))
        scores = log_softmax(rng.normal(size=(n + 1, n + 1)) * float(rng.choice([0.5, 3.0])))
        if rng.random() < 0.3:
            scores[:, 0] += 5  # MST without the one-root rule would take several roots
        best_score, best_heads = brute_force(scores)
        heads = mst_heads(scores)
        assert tree_score(scores, heads) == pytest.approx(best_score, abs=1e-9)
        assert heads.tolist() == best_heads


def test_parser_v1_is_never_better_than_mst():
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        scores = log_softmax(rng.normal(size=(n + 1, n + 1)) * 3)
        assert tree_score(scores, parser_v1_heads(scores)) <= tree_score(scores, mst_heads(scores)) + 1e-9


def probs_to_scores(p: list[list[float]]) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.array(p, dtype=np.float64))


def test_parser_v1_greedy_tree_is_kept():
    # rows: dependents 0..3 (row 0 ignored); columns: heads 0..3
    s = probs_to_scores([[1, 0, 0, 0],
                         [.1, 0, .8, .1],
                         [.7, .1, 0, .2],
                         [.1, .2, .6, .1]])
    assert parser_v1_heads(s).tolist() == [0, 2, 0, 2]


def test_parser_v1_no_root_picks_the_best_root_to_head_ratio():
    # greedy: 1 -> 2, 2 -> 3, 3 -> 2 (no root). Ratios p(root)/p(head): word 1 .1/.6,
    # word 2 .3/.5, word 3 .2/.6 -> word 2 becomes the root; 3 -> 2 stays: a tree.
    s = probs_to_scores([[1, 0, 0, 0],
                         [.1, 0, .6, .3],
                         [.3, .2, 0, .5],
                         [.2, .2, .6, 0]])
    assert parser_v1_heads(s).tolist() == [0, 2, 0, 2]


def test_parser_v1_several_roots_keeps_the_one_that_would_lose_most():
    # greedy: all three attach to ROOT. Moving: word 1 -> 2 ratio .3/.5, word 2 -> 3 .1/.6,
    # word 3 -> 2 .35/.4. The smallest ratio (word 2) stays the root; 1 -> 2, 3 -> 2.
    s = probs_to_scores([[1, 0, 0, 0],
                         [.5, 0, .3, .2],
                         [.6, .1, 0, .1],
                         [.4, .25, .35, 0]])
    assert parser_v1_heads(s).tolist() == [0, 2, 0, 2]


def test_parser_v1_breaks_a_cycle_by_the_best_ratio_outside_the_subtree():
    # greedy: 1 -> ROOT, 2 -> 3, 3 -> 2 (a cycle), 4 -> 3 (hangs under the cycle).
    # For cycle node 2 the best head outside {2, 3, 4} is 1 (.3 vs old .5: ratio .6);
    # for node 3 it is 1 (.1 vs old .6: ratio 1/6) -> 2 moves to 1.
    s = probs_to_scores([[1, 0, 0, 0, 0],
                         [.9, 0, .05, .03, .02],
                         [.05, .3, 0, .5, .15],
                         [.05, .1, .6, 0, .25],
                         [.05, .1, .15, .7, 0]])
    heads = parser_v1_heads(s)
    assert heads.tolist() == [0, 0, 1, 2, 3]
    assert is_tree(heads)


def test_parser_v1_relations_exactly_one_root_label():
    ROOT = 0  # relation index of "root"
    # argmax gives no root label: the word most likely to be root (word 2) gets it
    s = probs_to_scores([[1, 0, 0], [.2, .7, .1], [.4, .5, .1], [.1, .1, .8]])
    assert parser_v1_rels(s, ROOT).tolist()[1:] == [1, 0, 2]
    # two root labels: word 1 would keep .3/.6, word 3 .2/.7 of it -> word 3 keeps root
    s = probs_to_scores([[1, 0, 0], [.6, .3, .1], [.1, .8, .1], [.7, .1, .2]])
    assert parser_v1_rels(s, ROOT).tolist()[1:] == [1, 1, 0]
    # without a root relation: plain argmax
    assert parser_v1_rels(s, None).tolist()[1:] == [0, 1, 0]
