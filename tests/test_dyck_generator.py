"""Tests for the Dyck-(k, m) sampler, file format and validator."""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.dyck.files import read_split, validate_file, write_split
from lstmablate_tasks.dyck.generator import (
    PRESETS,
    SECOND_ORDER,
    default_lengths,
    generate,
    make_preset_splits,
    make_splits,
    split_seed,
)
from lstmablate_tasks.dyck.language import (
    END_ID,
    DyckVocab,
    StackState,
    stack_annotations,
    validate_sequences,
)


def replay(seq: list[int], k: int) -> tuple[bool, int]:
    """Independent checker: (is a well-nested string ending in one END, max depth)."""
    stack: list[int] = []
    depth = 0
    for pos, tok in enumerate(seq):
        if 3 <= tok < 3 + k:
            stack.append(tok - 3)
            depth = max(depth, len(stack))
        elif 3 + k <= tok < 3 + 2 * k:
            if not stack or stack.pop() != tok - 3 - k:
                return False, depth
        elif tok == END_ID:
            return pos == len(seq) - 1 and not stack, depth
        else:
            return False, depth
    return False, depth


# ---------------------------------------------------------------------------------------------
# Vocabulary


def test_vocab_layout_k2():
    v = DyckVocab(2)
    assert v.tokens == ["<pad>", "START", "END", "(a", "(b", "a)", "b)"]
    assert v.size == len(v) == 7
    assert [v.open_id(0), v.open_id(1), v.close_id(0), v.close_id(1)] == [3, 4, 5, 6]
    assert [v.is_open(i) for i in range(7)] == [False] * 3 + [True, True, False, False]
    assert [v.is_close(i) for i in range(7)] == [False] * 5 + [True, True]
    assert v.bracket_type(4) == 1 and v.bracket_type(6) == 1
    with pytest.raises(ValueError):
        v.bracket_type(END_ID)
    assert v.encode("(a (b b) a) END".split()) == [3, 4, 6, 5, 2]
    assert v.decode([3, 4, 6, 5, 2]) == "(a (b b) a) END".split()
    with pytest.raises(KeyError, match="c\\)"):
        v.encode(["(a", "c)"])


def test_vocab_large_k_names_are_unique():
    v = DyckVocab(60)
    assert v.size == 2 * 60 + 3
    assert len(set(v.tokens)) == v.size
    assert v.tokens[v.open_id(25)] == "(z" and v.tokens[v.open_id(26)] == "(aa"
    assert v.tokens[v.close_id(59)] == "hhh)"
    assert v.decode(v.encode(v.tokens)) == v.tokens


# ---------------------------------------------------------------------------------------------
# Samples


@pytest.mark.parametrize("k,m", [(2, 3), (3, 5), (1, 1)])
def test_samples_are_bounded_dyck_strings(k, m):
    min_len, max_len = 4, 60
    seqs = generate(k, m, seed=3, min_length=min_len, max_length=max_len, num_sequences=600)
    assert len(seqs) == 600
    depths = []
    for seq in seqs:
        ok, depth = replay(seq, k)
        assert ok, seq
        assert depth <= m
        depths.append(depth)
        # At least min_length brackets before END, END counted in the length.
        assert min_len + 1 <= len(seq) <= max_len
    assert max(depths) == m  # the bound is reached
    stats = validate_sequences(seqs, k, m)
    assert stats.num_sequences == 600 and stats.max_depth == m
    assert stats.num_tokens == sum(map(len, seqs))
    assert stats.min_length == min(map(len, seqs)) and stats.max_length == max(map(len, seqs))


def test_num_tokens_keeps_adding_strings_until_budget():
    seqs = generate(2, 3, seed=0, min_length=1, max_length=84, num_tokens=5000)
    total = sum(map(len, seqs))
    assert total >= 5000
    assert total - len(seqs[-1]) < 5000


def test_generate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="exactly one"):
        generate(2, 3, seed=0, min_length=1, max_length=10, num_tokens=10, num_sequences=1)
    with pytest.raises(ValueError, match="exactly one"):
        generate(2, 3, seed=0, min_length=1, max_length=10)
    with pytest.raises(ValueError, match="max_length"):  # 1 bracket is impossible, 2 + END > 2
        generate(2, 3, seed=0, min_length=1, max_length=2, num_sequences=1)
    with pytest.raises(ValueError):
        generate(0, 3, seed=0, min_length=1, max_length=10, num_sequences=1)


def test_default_lengths_follow_hewitt():
    assert default_lengths(3) == {"train": (1, 84), "dev": (1, 84), "test": (85, 168)}
    assert default_lengths(5) == {"train": (1, 180), "dev": (1, 180), "test": (181, 360)}


def test_default_splits_test_strings_are_longer_than_train():
    m = 3
    splits = make_splits(2, m, seed=0, train_sequences=500, dev_sequences=100, test_sequences=60)
    lengths = default_lengths(m)
    for name in ("train", "dev", "test"):
        lo, hi = lengths[name]
        seqs = splits.split(name)
        assert all(replay(s, 2)[0] for s in seqs)
        assert all(lo < len(s) <= hi for s in seqs), name
    assert min(map(len, splits.test)) > max(map(len, splits.train))
    assert min(map(len, splits.test)) > lengths["train"][1]


def test_splits_use_distinct_documented_seeds():
    splits = make_splits(2, 3, seed=0, train_sequences=50, dev_sequences=50, test_sequences=5)
    assert splits.split_seeds == {"train": 1, "dev": 1000, "test": 2000}
    assert splits.train != splits.dev  # same lengths, different seeds
    again = make_splits(2, 3, seed=0, train_sequences=50, dev_sequences=50, test_sequences=5)
    assert again.train == splits.train and again.test == splits.test
    other = make_splits(2, 3, seed=1, train_sequences=50, dev_sequences=50, test_sequences=5)
    assert other.split_seeds == {"train": 10_001, "dev": 11_000, "test": 12_000}
    assert other.train != splits.train
    seeds = [split_seed(s, n) for s in range(50) for n in ("train", "dev", "test")]
    assert len(set(seeds)) == len(seeds)


def test_make_splits_default_dev_test_sizes_are_in_tokens():
    splits = make_splits(2, 3, seed=0, train_tokens=200)
    assert sum(map(len, splits.train)) >= 200
    assert 20_000 <= sum(map(len, splits.dev)) < 20_000 + 84
    assert 300_000 <= sum(map(len, splits.test)) < 300_000 + 168


def test_second_order_preset():
    assert PRESETS["second-order"] is SECOND_ORDER
    assert SECOND_ORDER.k == 2 and SECOND_ORDER.m_values == (4, 6, 8)
    sizes = (SECOND_ORDER.train_sequences, SECOND_ORDER.dev_sequences, SECOND_ORDER.test_sequences)
    assert sum(sizes) == 24_000
    splits = make_preset_splits("second-order", 4, seed=0)
    assert (len(splits.train), len(splits.dev), len(splits.test)) == sizes
    assert splits.k == 2 and splits.m == 4
    assert validate_sequences(splits.test, 2, 4).max_depth == 4
    with pytest.raises(ValueError, match="m in"):
        make_preset_splits("second-order", 5)
    with pytest.raises(ValueError, match="preset"):
        make_preset_splits("nope", 4)


def test_empirical_frequencies_match_the_automaton():
    """Every draw of the sampler follows the automaton's next-token distribution.

    No string is rejected for length here (max_length is huge), so each position is an
    independent draw from the automaton given its state, and the observed frequencies must lie
    within 4 standard errors of the automaton's probabilities.
    """
    k, m, min_len = 3, 4, 6
    vocab = DyckVocab(k)
    seqs = generate(k, m, seed=11, min_length=min_len, max_length=10**6, num_sequences=4000)
    counts: dict[str, Counter] = {"empty": Counter(), "early": Counter(), "mid": Counter()}
    full_total = full_close = 0
    for seq in seqs:
        stack: list[int] = []
        for t, tok in enumerate(seq):
            if not stack:
                key = "empty" if t >= min_len else "early"
                counts[key]["END" if tok == END_ID else vocab.bracket_type(tok)] += 1
            elif len(stack) == m:
                full_total += 1
                full_close += tok == vocab.close_id(stack[-1])
            else:
                closes_top = tok == vocab.close_id(stack[-1])
                counts["mid"]["close" if closes_top else vocab.bracket_type(tok)] += 1
            if vocab.is_open(tok):
                stack.append(vocab.bracket_type(tok))
            elif vocab.is_close(tok):
                stack.pop()

    def close_to(count: int, n: int, p: float) -> bool:
        return abs(count / n - p) <= 4 * math.sqrt(p * (1 - p) / n)

    assert full_total > 1000 and full_close == full_total
    for key, stop in (("empty", "END"), ("mid", "close")):
        c = counts[key]
        n = sum(c.values())
        assert n > 5000, key
        assert set(c) == {stop, *range(k)}, key
        assert close_to(c[stop], n, 1 / 2), (key, c)
        for typ in range(k):
            assert close_to(c[typ], n, 1 / (2 * k)), (key, typ, c)
    # Before min_length an END is redrawn, so only opens occur, uniformly.
    early = counts["early"]
    n = sum(early.values())
    assert "END" not in early and n > 3000
    for typ in range(k):
        assert close_to(early[typ], n, 1 / k), early


def test_stack_annotations():
    v = DyckVocab(2)
    seq = v.encode("(a (b b) (a a) a) END".split())
    assert stack_annotations(seq, 2) == [
        StackState(1, 0, 0),
        StackState(2, 1, 1),
        StackState(1, 0, 0),
        StackState(2, 0, 3),
        StackState(1, 0, 0),
        StackState(0, None, None),
        StackState(0, None, None),
    ]
    with pytest.raises(ValueError, match="does not match"):
        stack_annotations(v.encode("(a b)".split()), 2)


# ---------------------------------------------------------------------------------------------
# Files and determinism


def _corpus_bytes(tmp_path: Path, seed: int, name: str = "c.txt") -> bytes:
    seqs = generate(2, 3, seed=seed, min_length=1, max_length=84, num_sequences=200)
    path = tmp_path / name
    write_split(path, seqs, DyckVocab(2))
    return path.read_bytes()


def test_same_seed_same_bytes_different_seed_different_bytes(tmp_path):
    a = _corpus_bytes(tmp_path, 5, "a.txt")
    b = _corpus_bytes(tmp_path, 5, "b.txt")
    c = _corpus_bytes(tmp_path, 6, "c.txt")
    assert a == b
    assert a != c
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt", "c.txt"]  # no temp files left


def test_corpus_is_pinned_across_versions(tmp_path):
    """Golden output: changing how random numbers are drawn must be a deliberate decision."""
    seqs = generate(2, 3, seed=0, min_length=1, max_length=84, num_sequences=50)
    path = tmp_path / "golden.txt"
    write_split(path, seqs, DyckVocab(2))
    lines = path.read_text().splitlines()
    assert lines[:3] == [
        "(a a) END",
        "(b (b b) (b (a a) b) (b b) (a (a a) a) b) (a a) END",
        "(b b) END",
    ]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == "8dc394ff221fb6205d44a53e6858dcc485dba7dc6febe1536c9c81e0f2c2bbd0"


def test_corpus_does_not_depend_on_hash_seed(tmp_path):
    code = (
        "import hashlib, sys\n"
        "from lstmablate_tasks.dyck.generator import generate\n"
        "from lstmablate_tasks.dyck.files import write_split\n"
        "from lstmablate_tasks.dyck.language import DyckVocab\n"
        "seqs = generate(3, 4, seed=9, min_length=1, max_length=100, num_tokens=3000)\n"
        "write_split(sys.argv[1], seqs, DyckVocab(3))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    outputs = []
    for hash_seed in ("0", "12345"):
        out = tmp_path / f"h{hash_seed}.txt"
        subprocess.run(
            [sys.executable, "-c", code, str(out)],
            env={**env, "PYTHONHASHSEED": hash_seed},
            check=True,
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1000


@pytest.mark.parametrize("name", ["train.txt", "train.txt.gz"])
def test_write_read_round_trip(tmp_path, name):
    vocab = DyckVocab(3)
    seqs = generate(3, 4, seed=2, min_length=1, max_length=100, num_sequences=100)
    path = tmp_path / name
    write_split(path, seqs, vocab)
    assert read_split(path, vocab) == seqs
    if name.endswith(".gz"):
        first = gzip.decompress(path.read_bytes()).decode().splitlines()[0]
        assert first == " ".join(vocab.decode(seqs[0]))
        again = tmp_path / ("again-" + name)
        write_split(again, seqs, vocab)
        assert again.read_bytes() == path.read_bytes()  # no timestamp in the gzip header
    stats = validate_file(path, 3, 4)
    assert stats.num_sequences == 100 and stats.num_tokens == sum(map(len, seqs))


def test_split_files_written_by_dyck_splits(tmp_path):
    splits = make_splits(2, 3, seed=0, train_sequences=20, dev_sequences=5, test_sequences=5)
    paths = splits.write(tmp_path / "data")
    assert sorted(p.name for p in paths.values()) == ["dev.txt", "test.txt", "train.txt"]
    assert read_split(paths["test"], splits.vocab) == splits.test


GOOD = "(a (b b) a) END"


@pytest.mark.parametrize(
    "bad_line,fragment",
    [
        ("(a (b (a (b b) a) b) a) END", "over the bound m=3"),  # depth 4
        ("(a (b a) b) END", "does not match"),  # crossed
        ("(a (a a) END", "unclosed"),  # unbalanced
        ("a) END", "never opened"),
        ("(a (c c) a) END", "'(c' is not in the Dyck-2 vocabulary"),  # unknown token
        ("(a a)", "does not end with END"),
        ("(a a) END (b b) END", "END appears before the end of the line"),
        ("START (a a) END", "reserved"),
        ("", "blank line"),
    ],
)
def test_validate_file_reports_first_offending_line(tmp_path, bad_line, fragment):
    # Later lines are bad too (an unknown token and an over-deep string); the first must win.
    lines = [GOOD, "(b b) (a a) END", bad_line, "(x x) END", "(a (a (a (a a) a) a) a) END", GOOD]
    path = tmp_path / "bad.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as info:
        validate_file(path, k=2, m=3)
    message = str(info.value)
    assert f"{path}, line 3:" in message
    assert fragment in message
    assert "\n" not in message


def test_read_split_errors_name_file_and_line(tmp_path):
    vocab = DyckVocab(2)
    path = tmp_path / "bad.txt"
    path.write_text(f"{GOOD}\n{GOOD}\n(a a) (b\n")
    with pytest.raises(DataError, match=r"bad\.txt, line 3: .*does not end with END"):
        read_split(path, vocab)
    path.write_text(f"{GOOD}\n\n{GOOD}\n")
    with pytest.raises(DataError, match=r"line 2: blank line"):
        read_split(path, vocab)
    path.write_text(f"{GOOD}\n(q q) END\n")
    with pytest.raises(DataError, match=r"line 2: token 1 '\(q' is not in the Dyck-2 vocabulary"):
        read_split(path, vocab)
    # read_split checks tokens only; nesting is validate_file's job.
    path.write_text("(a b) END\n")
    assert read_split(path, vocab) == [[3, 6, 2]]
    with pytest.raises(DataError, match="line 1: not a Dyck-\\(2, 3\\) string"):
        validate_file(path, 2, 3)


def test_unreadable_files_raise_data_error(tmp_path):
    vocab = DyckVocab(2)
    with pytest.raises(DataError, match="not found"):
        read_split(tmp_path / "missing.txt", vocab)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        read_split(empty, vocab)
    fake_gz = tmp_path / "fake.txt.gz"
    fake_gz.write_text(f"{GOOD}\n")
    with pytest.raises(DataError, match="fake.txt.gz"):
        read_split(fake_gz, vocab)
    latin = tmp_path / "latin.txt"
    latin.write_bytes(GOOD.encode() + b"\n(a \xe9 a) END\n")
    with pytest.raises(DataError, match="line 2: not UTF-8"):
        read_split(latin, vocab)


def test_validate_sequences_names_the_bad_sequence():
    v = DyckVocab(2)
    seqs = [v.encode(GOOD.split()), v.encode("(a (b a) b) END".split())]
    with pytest.raises(DataError, match="sequence 1 .*does not match"):
        validate_sequences(seqs, 2, 3)
    with pytest.raises(DataError, match="sequence 0 .*over the bound m=1"):
        validate_sequences(seqs, 2, 1)
