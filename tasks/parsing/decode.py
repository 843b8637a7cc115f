"""Decoding arc scores to a well-formed tree, and relations given the heads.

A sentence of n words is scored as an (n+1) x (n+1) matrix ``scores[dep, head]`` of
log-probabilities (row 0, the ROOT token, is ignored); a tree is an array ``heads``
of length n+1 with ``heads[0] = 0``, exactly one word attached to 0, and no cycle.

* :func:`parser_v1_heads` — Parser-v1's ``ensure_tree`` heuristic
  (``lib/models/nn.py: parse_argmax``, ``lib/etc/tarjan.py``):
  greedy argmax heads with self-loops blocked; if no word is attached to ROOT, the
  word with the best ratio p(root)/p(current head) becomes the root; if several
  are, each would move to its best other head and the one that would lose most
  (the smallest ratio p(new head)/p(root)) stays; then every cycle, found as a
  strongly connected component by Tarjan's algorithm, is broken by moving the one
  cycle word whose best head outside its own subtree has the best ratio
  p(new head)/p(old head).  Ratios of probabilities are differences of
  log-probabilities here.  (Parser-v1's Tarjan passes its visit counter by value;
  on these graphs — every node has one head — that gives the same components as
  the textbook algorithm used here, visited in the same ascending order.)
* :func:`mst_heads` — the maximum spanning tree (Chu-Liu/Edmonds) with exactly one
  word attached to ROOT: every ROOT edge is lowered by a constant larger than any
  difference of tree scores, so the best arborescence uses one ROOT edge and is,
  among those, the best (the reduction of Gabow & Tarjan 1984).
* :func:`parser_v1_rels` — Parser-v1's ``rel_argmax`` with ``ensure_tree``: argmax
  relation per word given its head, then exactly one word labelled ``root``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

NEG = -np.inf
DECODERS = ("parser-v1", "mst")


def is_tree(heads: Sequence[int]) -> bool:
    """One word attached to 0 (index 0 is ROOT, ``heads[0]`` ignored), no cycle."""
    heads = list(heads)
    n = len(heads) - 1
    if n < 1 or sum(1 for h in heads[1:] if h == 0) != 1:
        return False
    if any(not 0 <= h <= n for h in heads[1:]):
        return False
    return _find_cycle(np.asarray(heads)) is None


def _find_cycle(heads: np.ndarray) -> list[int] | None:
    """A cycle of the head graph (nodes 1..n, 0 is the root), or None."""
    n = len(heads)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current walk, 2 done
    state[0] = 2
    for start in range(1, n):
        walk = []
        v = start
        while state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = int(heads[v])
        if state[v] == 1:  # walked into the current walk: a cycle from v
            return walk[walk.index(v):]
        for u in walk:
            state[u] = 2
    return None


# ---------------------------------------------------------------- Parser-v1's heuristic
def tarjan_sccs(heads: np.ndarray) -> list[list[int]]:
    """Strongly connected components of the graph head -> dependent over nodes 0..n
    (Tarjan 1972), vertices and edges visited in ascending order, components in the
    order Tarjan's algorithm completes them."""
    n = len(heads)
    children: list[list[int]] = [[] for _ in range(n)]
    for dep in range(1, n):
        children[int(heads[dep])].append(dep)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack = [False] * n
    stack: list[int] = []
    sccs: list[list[int]] = []
    counter = 0

    def connect(v: int) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack[v] = True
        for w in children[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif on_stack[w]:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack[w] = False
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    limit = sys.getrecursionlimit()
    if n + 100 > limit:
        sys.setrecursionlimit(n + 100)
    try:
        for v in range(n):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sccs


def parser_v1_heads(scores: np.ndarray) -> np.ndarray:
    """Parser-v1's ``parse_argmax`` with ``ensure_tree`` on log-probabilities (n+1, n+1)."""
    s = np.array(scores, dtype=np.float64, copy=True)
    n1 = s.shape[0]
    if n1 < 2:
        raise ValueError("a sentence needs at least one word")
    np.fill_diagonal(s, NEG)  # block self-loops
    heads = s.argmax(axis=1)
    heads[0] = 0
    tokens = np.arange(1, n1)
    roots = tokens[heads[tokens] == 0]
    if len(roots) < 1:
        # the word with the best p(root) / p(current head) becomes the root
        gain = s[tokens, 0] - s[tokens, heads[tokens]]
        heads[tokens[np.argmax(gain)]] = 0
    elif len(roots) > 1:
        root_scores = s[roots, 0].copy()
        s[roots, 0] = NEG
        new_heads = np.argmax(s[roots][:, tokens], axis=1) + 1
        ratio = s[roots, new_heads] - root_scores
        keep = roots[np.argmin(ratio)]  # the one that would lose most stays the root
        heads[roots] = new_heads
        heads[keep] = 0
    children: list[set[int]] = [set() for _ in range(n1)]
    for dep in tokens:
        children[heads[dep]].add(int(dep))
    for scc in tarjan_sccs(heads):
        if len(scc) < 2:
            continue
        # every node reachable from the cycle (the cycle and its subtrees)
        dependents: set[int] = set()
        to_visit = set(scc)
        while to_visit:
            v = to_visit.pop()
            if v not in dependents:
                dependents.add(v)
                to_visit.update(children[v])
        cycle = np.array(scc)
        old_heads = heads[cycle]
        old_scores = s[cycle, old_heads]
        non_heads = np.array(sorted(dependents))
        s[np.ix_(cycle, non_heads)] = NEG  # no head inside its own subtree
        new_heads = np.argmax(s[cycle][:, tokens], axis=1) + 1
        ratio = s[cycle, new_heads] - old_scores
        change = int(np.argmax(ratio))
        node, old, new = int(cycle[change]), int(old_heads[change]), int(new_heads[change])
        heads[node] = new
        children[new].add(node)
        children[old].discard(node)
    if not is_tree(heads):  # only if every candidate head had probability 0 (-inf)
        return mst_heads(scores)
    return heads


# ---------------------------------------------------------------- Chu-Liu/Edmonds
def _chu_liu_edmonds(s: np.ndarray) -> np.ndarray:
    """Maximum spanning arborescence rooted at 0 of s[dep, head] (diagonal and row 0
    ignored); returns heads with heads[0] = 0."""
    n = s.shape[0]
    s = s.copy()
    np.fill_diagonal(s, NEG)
    heads = s.argmax(axis=1)
    heads[0] = 0
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    cyc = np.array(sorted(cycle))
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[cyc] = True
    rest = np.flatnonzero(~in_cycle)  # rest[0] == 0: ROOT is never on a cycle
    m = len(rest)
    c = m  # the contracted cycle's index in the smaller graph
    sub = np.full((m + 1, m + 1), NEG)
    sub[:m, :m] = s[np.ix_(rest, rest)]
    # a head v outside entering the cycle at node x replaces x's cycle edge:
    # score s[x, v] - s[x, heads[x]] (the rest of the cycle is kept)
    enter = s[np.ix_(cyc, rest)] - s[cyc, heads[cyc]][:, None]
    best_enter = enter.argmax(axis=0)
    sub[c, :m] = enter[best_enter, np.arange(m)]
    # the cycle as the head of an outside word u: its best cycle node
    leave = s[np.ix_(rest, cyc)]
    best_leave = leave.argmax(axis=1)
    sub[:m, c] = leave[np.arange(m), best_leave]
    sub_heads = _chu_liu_edmonds(sub)
    out = heads.copy()  # cycle nodes keep their cycle heads unless entered
    for i in range(1, m):
        h = sub_heads[i]
        out[rest[i]] = cyc[best_leave[i]] if h == c else rest[h]
    v = sub_heads[c]
    out[cyc[best_enter[v]]] = rest[v]
    return out


def mst_heads(scores: np.ndarray) -> np.ndarray:
    """The highest-scoring tree with exactly one word attached to ROOT."""
    s = np.array(scores, dtype=np.float64, copy=True)
    n1 = s.shape[0]
    if n1 < 2:
        raise ValueError("a sentence needs at least one word")
    np.fill_diagonal(s, NEG)
    s[0, :] = NEG
    finite = s[np.isfinite(s)]
    if finite.size == 0:
        raise ValueError("no finite arc score")
    # larger than any difference between two trees' scores: one ROOT edge always wins
    penalty = n1 * (float(finite.max()) - float(finite.min()) + 1.0)
    s[1:, 0] -= penalty
    return _chu_liu_edmonds(s)


def tree_score(scores: np.ndarray, heads: Sequence[int]) -> float:
    """Sum of scores[dep, heads[dep]] over the words."""
    idx = np.arange(1, len(heads))
    return float(np.asarray(scores, dtype=np.float64)[idx, np.asarray(heads)[idx]].sum())


def decode_heads(scores: np.ndarray, decoder: str = "parser-v1") -> np.ndarray:
    if decoder == "parser-v1":
        return parser_v1_heads(scores)
    if decoder == "mst":
        return mst_heads(scores)
    raise ValueError(f"unknown decoder {decoder!r}; choose from {DECODERS}")


# ---------------------------------------------------------------- relations
def parser_v1_rels(rel_scores: np.ndarray, root_rel: int | None) -> np.ndarray:
    """Parser-v1's ``rel_argmax`` with ``ensure_tree`` on log-probabilities (n+1, R) of each
    word's relation given its (predicted) head (row 0 ignored): the argmax, then exactly one
    word labelled ``root_rel`` — if none, the word most likely to be ``root``; if several,
    all but the one that would lose most take their next-best relation.  Parser-v1 does this
    independently of which word the heads attach to ROOT.  ``root_rel`` None: plain argmax."""
    s = np.array(rel_scores, dtype=np.float64, copy=True)
    rels = s.argmax(axis=1)
    if root_rel is None:
        return rels
    tokens = np.arange(1, s.shape[0])
    roots = tokens[rels[tokens] == root_rel]
    if len(roots) < 1:
        rels[1 + np.argmax(s[tokens, root_rel])] = root_rel
    elif len(roots) > 1:
        root_scores = s[roots, root_rel].copy()
        s[roots, root_rel] = NEG
        new = s[roots].argmax(axis=1)
        ratio = s[roots, new] - root_scores
        keep = roots[np.argmin(ratio)]
        rels[roots] = new
        rels[keep] = root_rel
    return rels
