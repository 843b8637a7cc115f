"""Tests of the PTB reader (lstmablate_tasks.ptb.data): vocabulary, char level, batching."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from lstmablate.errors import ConfigError, DataError, UnknownNameError
from lstmablate_tasks.ptb import data as P

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_LINES = {
    split: (FIXTURES / "ptb" / f"ptb.{split}.txt").read_text().splitlines()
    for split in P.SPLITS
}


def _fixture_corpus(level: str = "word") -> P.PTBCorpus:
    return P.load_corpus(FIXTURES, level=level, verify=False)


# ---------------------------------------------------------------- word level


def test_fixture_vocab_is_train_only_by_frequency_then_alphabetical():
    corpus = _fixture_corpus()
    # Counted by hand from tests/fixtures/ptb/ptb.train.txt (8 lines, 45 words):
    # 8: <eos> the | 5: sat | 4: a cat dog | 3: <unk> on ran | 2: N and mat |
    # 1: cats dogs mr. said to      (ties in code-point order: '<' < 'N' < 'a')
    assert corpus.vocab == ["<eos>", "the", "sat", "a", "cat", "dog", "<unk>", "on", "ran",
                            "N", "and", "mat", "cats", "dogs", "mr.", "said", "to"]
    assert corpus.stoi == {w: i for i, w in enumerate(corpus.vocab)}
    assert corpus.vocab_size == 17 and corpus.eos_id == 0
    assert corpus.level == "word"


def test_fixture_streams_are_the_file_tokens_with_eos():
    corpus = _fixture_corpus()
    for split in P.SPLITS:
        stream = corpus.split(split)
        assert stream.dtype == torch.long and stream.dim() == 1
        expected = [tok for line in FIXTURE_LINES[split] for tok in line.split() + ["<eos>"]]
        assert corpus.decode(stream) == expected
        assert int((stream == corpus.eos_id).sum()) == len(FIXTURE_LINES[split])
    assert corpus.train.numel() == 45 + 8
    assert corpus.files["train"] == FIXTURES / "ptb" / "ptb.train.txt"


def test_build_vocab_ties_alphabetical():
    assert P.build_vocab("b a c b a d".split()) == ["a", "b", "c", "d"]
    assert P.build_vocab(["x", "y", "y"]) == ["y", "x"]


def test_unknown_word_in_valid_names_file_and_line(tmp_path):
    shutil.copytree(FIXTURES / "ptb", tmp_path / "ptb")
    valid = tmp_path / "ptb" / "ptb.valid.txt"
    valid.write_text(" the cat ran \n a zebra sat \n")
    with pytest.raises(DataError) as exc:
        P.load_corpus(tmp_path, verify=False)
    msg = str(exc.value)
    assert f"{valid}, line 2" in msg and "'zebra'" in msg
    assert str(tmp_path / "ptb" / "ptb.train.txt") in msg


def test_gz_fixture_reads_the_same(tmp_path):
    import gzip

    (tmp_path / "ptb").mkdir()
    for split in P.SPLITS:
        src = FIXTURES / "ptb" / f"ptb.{split}.txt"
        (tmp_path / "ptb" / f"ptb.{split}.txt.gz").write_bytes(gzip.compress(src.read_bytes()))
    a, b = _fixture_corpus(), P.load_corpus(tmp_path, verify=False)
    assert a.vocab == b.vocab
    for split in P.SPLITS:
        assert torch.equal(a.split(split), b.split(split))


def test_verify_rejects_files_that_are_not_real_ptb():
    with pytest.raises(DataError, match="checksum mismatch"):
        P.load_corpus(FIXTURES, verify=True)


def test_missing_files_and_bad_level(tmp_path):
    with pytest.raises(DataError, match="lstmablate data fetch ptb"):
        P.load_corpus(tmp_path, verify=False)
    with pytest.raises(UnknownNameError, match="Did you mean 'char'"):
        P.load_corpus(FIXTURES, level="chars", verify=False)


# ---------------------------------------------------------------- char level


def test_char_derivation_hand_checked():
    line = FIXTURE_LINES["train"][6]
    assert line == " mr. <unk> said the dog ran "
    assert P.line_tokens(line, "char") == [
        "m", "r", ".", "_", "<", "u", "n", "k", ">", "_", "s", "a", "i", "d", "_",
        "t", "h", "e", "_", "d", "o", "g", "_", "r", "a", "n", "<eos>"]
    # The corresponding line of Mikolov's ptb.char.*.txt (without its newline).
    assert P.char_line(line) == " m r . _ < u n k > _ s a i d _ t h e _ d o g _ r a n "
    assert P.char_line(" aer banknote ") == " a e r _ b a n k n o t e "
    assert P.line_tokens(" N cats \n", "char") == ["N", "_", "c", "a", "t", "s", "<eos>"]


def test_char_corpus_on_fixture():
    corpus = _fixture_corpus("char")
    assert corpus.level == "char"
    assert "_" in corpus.stoi and "<eos>" in corpus.stoi and "<" in corpus.stoi
    assert "<unk>" not in corpus.stoi  # spelt out as characters
    assert all(len(tok) == 1 for tok in corpus.vocab if tok != "<eos>")
    for split in P.SPLITS:
        expected = [c for line in FIXTURE_LINES[split]
                    for c in list("_".join(line.split())) + ["<eos>"]]
        assert corpus.decode(corpus.split(split)) == expected
    # The space of the first line start: no leading or trailing '_' in any line.
    text = "".join(corpus.decode(corpus.train))
    assert "<eos>_" not in text and "_<eos>" not in text and not text.startswith("_")


# ---------------------------------------------------------------- batching


def test_stream_batches_hand_checked():
    data = torch.arange(23)
    # batch_len = 23 // 3 = 7 (token 21, 22 dropped); epoch_size = (7 - 1) // 2 = 3
    rows = [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [14, 15, 16, 17, 18, 19, 20]]
    assert P.num_batches(23, 3, 2) == 3
    batches = list(P.stream_batches(data, batch_size=3, num_steps=2))
    assert len(batches) == 3
    x0, y0 = batches[0]
    assert x0.tolist() == [[0, 1], [7, 8], [14, 15]]
    assert y0.tolist() == [[1, 2], [8, 9], [15, 16]]
    x2, y2 = batches[2]
    assert x2.tolist() == [[4, 5], [11, 12], [18, 19]]
    assert y2.tolist() == [[5, 6], [12, 13], [19, 20]]
    assert torch.cat([x for x, _ in batches], dim=1).tolist() == [r[:6] for r in rows]


@pytest.mark.parametrize("batch_size,num_steps", [(2, 4), (3, 5), (1, 7), (4, 1), (5, 2)])
def test_batches_shifted_contiguous_and_epoch_size(batch_size, num_steps):
    data = _fixture_corpus().train
    n = data.numel()
    epoch_size = ((n // batch_size) - 1) // num_steps
    assert P.num_batches(n, batch_size, num_steps) == epoch_size
    batches = list(P.stream_batches(data, batch_size, num_steps))
    assert len(batches) == epoch_size > 0
    batch_len = n // batch_size
    for i, (x, y) in enumerate(batches):
        assert x.shape == y.shape == (batch_size, num_steps)
        assert x.dtype == torch.long
        # Targets are the inputs shifted by one token.
        assert torch.equal(y[:, :-1], x[:, 1:])
        for r in range(batch_size):
            start = r * batch_len + i * num_steps
            assert x[r].tolist() == data[start:start + num_steps].tolist()
            assert y[r].tolist() == data[start + 1:start + num_steps + 1].tolist()
        if i + 1 < len(batches):
            nx, _ = batches[i + 1]
            # The row continues: the last target of batch i is the first input of batch i+1,
            # which follows the last input of batch i in the token stream.
            assert torch.equal(y[:, -1], nx[:, 0])
            for r in range(batch_size):
                last = r * batch_len + (i + 1) * num_steps - 1
                assert (int(x[r, -1]), int(nx[r, 0])) == (int(data[last]), int(data[last + 1]))
    # Rows are contiguous streams of the data: concatenating the inputs gives each row's prefix.
    cat = torch.cat([x for x, _ in batches], dim=1)
    for r in range(batch_size):
        row_start = r * batch_len
        assert cat[r].tolist() == data[row_start:row_start + epoch_size * num_steps].tolist()


def test_num_batches_formula_over_many_lengths():
    for length in range(0, 60):
        for b in (1, 2, 3, 7):
            for s in (1, 2, 5):
                expected = max(0, ((length // b) - 1) // s)
                assert P.num_batches(length, b, s) == expected
                if expected:
                    assert len(list(P.stream_batches(torch.arange(length), b, s))) == expected


def test_resume_with_start_equals_skipping():
    data = _fixture_corpus().train
    full = list(P.stream_batches(data, 2, 3))
    for i in range(len(full) + 1):
        resumed = list(P.stream_batches(data, 2, 3, start=i))
        assert len(resumed) == len(full) - i
        for (x, y), (fx, fy) in zip(resumed, full[i:]):
            assert torch.equal(x, fx) and torch.equal(y, fy)
    with pytest.raises(ValueError):
        list(P.stream_batches(data, 2, 3, start=len(full) + 1))
    with pytest.raises(ValueError):
        list(P.stream_batches(data, 2, 3, start=-1))


def test_too_short_stream_is_a_clear_error():
    with pytest.raises(ConfigError, match="decrease batch_size or num_steps"):
        list(P.stream_batches(torch.arange(10), batch_size=5, num_steps=2))
    with pytest.raises(ConfigError):
        P.num_batches(10, 0, 2)
    with pytest.raises(ValueError):
        list(P.stream_batches(torch.arange(12).view(3, 4), 1, 1))


# ---------------------------------------------------------------- metrics


def test_metrics():
    assert P.perplexity(math.log(100.0)) == pytest.approx(100.0)
    assert P.perplexity(0.0) == 1.0
    assert P.perplexity(1e6) == math.inf
    assert P.bits_per_char(math.log(2.0)) == pytest.approx(1.0)
    assert P.bits_per_char(math.log(4.0)) == pytest.approx(2.0)
    assert P.bits_per_char(torch.tensor(math.log(8.0))) == pytest.approx(3.0)


# ---------------------------------------------------------------- real data


def _real_dir() -> Path:
    from conftest import skip_without_real_data

    return skip_without_real_data(*(P.FILES[split] for split in P.SPLITS))


@pytest.fixture(scope="module")
def real_word_corpus() -> P.PTBCorpus:
    return P.load_corpus(_real_dir(), level="word", verify=True)


def test_real_ptb_word_counts(real_word_corpus):
    c = real_word_corpus
    assert c.vocab_size == 10_000
    assert "<unk>" in c.stoi and "N" in c.stoi
    assert c.train.numel() == 929_589
    assert c.valid.numel() == 73_760
    assert c.test.numel() == 82_430
    lines = {"train": 42_068, "valid": 3_370, "test": 3_761}
    for split, n_lines in lines.items():
        assert int((c.split(split) == c.eos_id).sum()) == n_lines
    # The tutorial's ordering: the most frequent type is 'the', then <unk>/<eos> by count.
    assert c.vocab[0] == "the"
    counts = torch.bincount(c.train, minlength=c.vocab_size)
    assert bool((counts[:-1] >= counts[1:]).all())
    # Small-config epoch size of the tutorial: ((929589 // 20) - 1) // 20 = 2323.
    assert P.num_batches(c.train.numel(), 20, 20) == 2323
    assert P.num_batches(c.train.numel(), 20, 35) == 1327


def test_real_ptb_char_level():
    c = P.load_corpus(_real_dir(), level="char", verify=True)
    assert c.vocab_size == 50  # 49 characters + <eos>
    assert c.train.numel() == 4_975_414 + 42_068
    assert int((c.valid == c.eos_id).sum()) == 3_370
    assert int((c.test == c.eos_id).sum()) == 3_761
    assert c.vocab[0] == "_"
