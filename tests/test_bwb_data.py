"""The Billion Word reader on a small corpus in the benchmark's file format
(tests/fixtures/bwb/, written by its make_corpus.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from lstmablate.errors import DataError
from lstmablate_tasks.bwb import corpus

FIXTURE = Path(__file__).parent / "fixtures" / "bwb"
ROOT = FIXTURE / "bwb"
TRAIN = ROOT / corpus.TRAIN_DIR


@pytest.fixture(scope="module")
def vocab():
    return corpus.read_vocab(ROOT / "1b_word_vocab.txt")


def write(tmp_path, text, name="vocab.txt"):
    p = tmp_path / name
    p.write_text(text)
    return p


# -- vocabulary ------------------------------------------------------------------------------

def test_vocab_ids_are_line_numbers(vocab):
    lines = (ROOT / "1b_word_vocab.txt").read_text().splitlines()
    assert vocab.words == [line.split()[0] for line in lines]
    assert vocab.s_id == vocab.words.index("<S>") and vocab.unk_id == vocab.words.index("<UNK>")
    assert len(vocab) == 42


def test_sentence_is_wrapped_in_boundaries_and_unknown_words_are_unk(vocab):
    ids = vocab.sentence("w05 zz-unseen w08\n")
    assert ids == [vocab.s_id, vocab.stoi["w05"], vocab.unk_id, vocab.stoi["w08"], vocab.s_id]
    assert vocab.sentence("") == [vocab.s_id, vocab.s_id]  # an empty line: one prediction


@pytest.mark.parametrize("text, message", [
    ("<S> 5\n<UNK> 3\nthe\n", "vocab.txt, line 3: expected 'word count'"),
    ("<S> 5\n<UNK> 3\nthe x\n", "vocab.txt, line 3: expected 'word count'"),
    ("<S> 5\n<UNK> 3\nthe 4\n", "vocab.txt, line 3: count 4 is larger than the previous line's 3"),
    ("<S> 5\n<UNK> 3\n<S> 1\n", "vocab.txt, line 3: the word '<S>' is listed again (first on line 1)"),
    ("<S> 5\nthe 3\n", "has no '<UNK>'"),
    ("", "empty"),
])
def test_bad_vocabulary_names_file_and_line(tmp_path, text, message):
    with pytest.raises(DataError) as err:
        corpus.read_vocab(write(tmp_path, text))
    assert message in str(err.value)


# -- shards ----------------------------------------------------------------------------------

def test_training_shards_listed_in_order_plain_and_gzipped():
    names = [p.name for p in corpus.list_train_shards(ROOT)]
    assert names == ["news.en-00001-of-00100", "news.en-00002-of-00100", "news.en-00003-of-00100.gz"]


def test_missing_training_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="training-monolingual.tokenized.shuffled"):
        corpus.list_train_shards(tmp_path)


def test_shard_stream_in_file_order(vocab):
    path = TRAIN / "news.en-00001-of-00100"
    lines = path.read_text().splitlines()
    stream = corpus.shard_stream(path, vocab, seed=None).tolist()
    expected = []
    for line in lines:
        expected += [vocab.s_id, *vocab.encode(line.split())]
    expected.append(vocab.s_id)
    assert stream == expected
    sentences, tokens = corpus.shard_stats(path)
    assert (sentences, tokens) == (len(lines), len(stream))
    assert tokens == 1 + sum(len(line.split()) + 1 for line in lines)


def test_gzipped_shard_reads_like_plain(vocab, tmp_path):
    gz = TRAIN / "news.en-00003-of-00100.gz"
    plain = write(tmp_path, gzip.decompress(gz.read_bytes()).decode(), "plain")
    assert torch.equal(corpus.shard_stream(gz, vocab, 7), corpus.shard_stream(plain, vocab, 7))


def test_shuffled_stream_is_a_permutation_of_the_sentences(vocab):
    path = TRAIN / "news.en-00002-of-00100"

    def sentences(stream):
        s, out, cur = vocab.s_id, [], []
        for t in stream.tolist()[1:]:
            if t == s:
                out.append(tuple(cur))
                cur = []
            else:
                cur.append(t)
        return out

    a, b = corpus.shard_stream(path, vocab, 1), corpus.shard_stream(path, vocab, 2)
    plain = corpus.shard_stream(path, vocab, None)
    assert sorted(sentences(a)) == sorted(sentences(plain)) == sorted(sentences(b))
    assert sentences(a) != sentences(plain) and sentences(a) != sentences(b)
    assert torch.equal(a, corpus.shard_stream(path, vocab, 1))  # deterministic


# -- the training plan -----------------------------------------------------------------------

def make_plan(vocab, order=(2, 0, 1), seeds=(11, 12, 13), B=4, T=5):
    shards = [(p, corpus.shard_stats(p)[1]) for p in corpus.list_train_shards(ROOT)]
    return shards, corpus.ShardWindowPlan(shards, order, seeds, vocab, B, T)


def test_plan_windows_are_contiguous_rows_of_each_shard_in_order(vocab):
    B, T = 4, 5
    shards, plan = make_plan(vocab, B=B, T=T)
    expected = []
    for pos, j in enumerate((2, 0, 1)):
        stream = corpus.shard_stream(shards[j][0], vocab, (11, 12, 13)[pos])
        L = stream.numel() // B
        rows = stream[: B * L].view(B, L)
        for i in range(corpus.windows_in(stream.numel(), B, T)):
            expected.append((rows[:, i * T:(i + 1) * T], rows[:, i * T + 1:(i + 1) * T + 1]))
    assert len(plan) == len(expected) == sum(corpus.windows_in(t, B, T) for _, t in shards)
    for i, (x, y) in enumerate(expected):
        px, py, pw = plan[i]
        assert torch.equal(px, x.long()) and torch.equal(py, y.long())
        assert px.shape == (B, T) and bool(pw.eq(1).all())


def test_plan_is_random_access(vocab):
    _, plan = make_plan(vocab)
    _, fresh = make_plan(vocab)
    last = len(plan) - 1
    for i in (last, 0, 7, last // 2, 3):  # jumps between shards, as a resumed run does
        assert all(torch.equal(a, b) for a, b in zip(plan[i], fresh[i]))
    with pytest.raises(IndexError):
        plan[len(plan)]


def test_task_plan_depends_only_on_the_generator(tmp_path):
    from lstmablate_tasks.bwb.task import BillionWordTask

    task = BillionWordTask(BillionWordTask.DataConfig(batch_size=4, num_steps=5, vocab_size=0),
                           BillionWordTask.ModelConfig(), FIXTURE)
    task.use_artefacts(task.build_artefacts())
    task.setup(["train"])
    a = task.train_plan(0, torch.Generator().manual_seed(5))
    b = task.train_plan(0, torch.Generator().manual_seed(5))
    c = task.train_plan(1, torch.Generator().manual_seed(6))
    assert a.order == b.order and a.seeds == b.seeds
    assert (a.order, a.seeds) != (c.order, c.seeds)
    assert all(torch.equal(u, v) for u, v in zip(a[3], b[3]))


def test_artefacts_hold_vocab_and_shard_sizes():
    from lstmablate_tasks.bwb.task import BillionWordTask

    task = BillionWordTask(BillionWordTask.DataConfig(vocab_size=0), BillionWordTask.ModelConfig(),
                           FIXTURE)
    art = task.build_artefacts()
    assert art["vocab"][0] == "<S>" and len(art["vocab"]) == 42
    assert [s["file"] for s in art["shards"]] == ["news.en-00001-of-00100", "news.en-00002-of-00100",
                                                  "news.en-00003-of-00100"]
    assert [s["sentences"] for s in art["shards"]] == [120, 90, 60]


def test_vocab_size_mismatch_is_a_clear_error():
    from lstmablate_tasks.bwb.task import BillionWordTask

    task = BillionWordTask(BillionWordTask.DataConfig(), BillionWordTask.ModelConfig(), FIXTURE)
    with pytest.raises(DataError, match="has 42 words, but data.vocab_size=793470"):
        task.use_artefacts(task.build_artefacts())


# -- evaluation windows (data_utils.Dataset._iterate) -----------------------------------------

def test_deal_windows_by_hand():
    S = 9
    # 2 rows x 3 steps; sentences (1 2), (3), (4 5 6): rows are filled one after the other,
    # row 0 takes [S 1 2 S]; row 1 takes [S 3 S] and, with one token left, [S 4 5 6 S]
    wins = list(corpus.deal_windows([[1, 2], [3], [4, 5, 6]], 2, 3, S))
    x = [[[S, 1, 2], [S, 3, S]], [[0, 0, 0], [4, 5, 6]]]
    y = [[[1, 2, S], [3, S, 4]], [[0, 0, 0], [5, 6, S]]]
    w = [[[1, 1, 1], [1, 1, 1]], [[0, 0, 0], [1, 1, 1]]]
    assert len(wins) == 2  # the sentences run out: a last window would have no weight
    for (wx, wy, ww), ex, ey, ew in zip(wins, x, y, w):
        assert wx.tolist() == ex and wy.tolist() == ey and ww.tolist() == ew


def test_deal_windows_score_every_prediction_once(vocab):
    path = ROOT / corpus.HELDOUT_DIR / "news.en.heldout-00000-of-00050"
    sentences = [vocab.encode(line.split()) for line in corpus.read_lines(path)]
    scored: list[tuple[int, int]] = []
    for x, y, w in corpus.deal_windows(sentences, 3, 7, vocab.s_id):
        scored += [(a, b) for a, b, m in zip(x.flatten().tolist(), y.flatten().tolist(),
                                             w.flatten().tolist()) if m]
    expected = [(s[i], s[i + 1]) for sent in sentences
                for s in [[vocab.s_id, *sent, vocab.s_id]] for i in range(len(s) - 1)]
    assert len(scored) == sum(len(s) + 1 for s in sentences)
    assert sorted(scored) == sorted(expected)


def test_check_data_names_what_is_missing(tmp_path):
    from lstmablate_tasks.bwb.task import BillionWordTask

    task = BillionWordTask(BillionWordTask.DataConfig(train_shards=3, vocab_size=0),
                           BillionWordTask.ModelConfig(), FIXTURE)
    lines = task.check_data()  # three shards (one gzipped), vocabulary, dev and test
    assert len(lines) == 6 and lines[3].endswith("news.en-00003-of-00100.gz: present (no checksum known)")
    full = BillionWordTask(BillionWordTask.DataConfig(), BillionWordTask.ModelConfig(), FIXTURE)
    with pytest.raises(DataError, match=r"96 of 102 files missing \(training-monolingual.tokenized"
                                        r".shuffled/news.en-00004-of-00100, .* and 92 more\)"):
        full.check_data()
    with pytest.raises(DataError, match="102 of 102 files missing.*1-billion-word"):
        BillionWordTask(BillionWordTask.DataConfig(), BillionWordTask.ModelConfig(),
                        tmp_path).check_data()


def test_deal_windows_positions_name_each_prediction():
    S = 9
    wins = list(corpus.deal_windows([[1, 2], [3], [4, 5, 6]], 2, 3, S, positions=True))
    pos = [p.tolist() for *_, p in wins]
    # window 1: row 0 predicts 1, 2, S of sentence 0 (indices 1..3); row 1 predicts 3, S of
    # sentence 1 and then 4 (index 1) of sentence 2
    assert pos[0] == [[[0, 1], [0, 2], [0, 3]], [[1, 1], [1, 2], [2, 1]]]
    assert pos[1] == [[[-1, -1]] * 3, [[2, 2], [2, 3], [2, 4]]]


def test_data_check_reports_the_files_unchecked_not_failed():
    """No checksum was obtainable for the benchmark's files: checking the catalogue's files that
    are present says so per file instead of failing or passing them silently."""
    from lstmablate.data import check_file
    from lstmablate_tasks.bwb.task import BWB_DATASET

    vocab_file = BWB_DATASET.file("1b_word_vocab.txt")
    result = check_file(ROOT / "1b_word_vocab.txt", vocab_file)
    assert result.status == "unchecked"
    assert "no checksum" in result.message and "1b_word_vocab.txt" in result.message
