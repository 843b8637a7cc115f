"""NMT data side: Moses tokenisation, the recipe's last-line rule, the length filter,
torchtext-style vocabularies and torchtext's pooled batch order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from lstmablate.errors import DataError
from lstmablate_tasks.nmt import data as m30k
from lstmablate_tasks.nmt.batches import POOL_BATCHES, collate, pooled_batches
from lstmablate_tasks.nmt.task import NMTData, NMTModelConfig, NMTTask
from lstmablate_tasks.nmt.tokenise import detokenise, tokenise
from lstmablate_tasks.nmt.vocab import SRC_SPECIALS, TGT_SPECIALS, Vocab

FIXTURES = Path(__file__).parent / "fixtures" / "nmt"


# ---------------------------------------------------------------- tokenisation

def test_moses_flags_on_real_lines(real_data_dir):
    """-a splits intra-word hyphens as @-@; -no-escape keeps quotes and apostrophes raw."""
    src, _ = m30k.read_split(real_data_dir, "val", "en", "de", drop_last_line=False)
    assert src[-1] == "Two women wearing red and a man coming out of a port-a-potty."
    assert tokenise(src[-1], "en") == ["Two", "women", "wearing", "red", "and", "a", "man",
                                       "coming", "out", "of", "a", "port", "@-@", "a", "@-@",
                                       "potty", "."]
    _, de = m30k.read_split(real_data_dir, "val", "en", "de", drop_last_line=False)
    joe = next(line for line in de if "Trader Joe's" in line)
    toks = tokenise(joe, "de")
    # no escaping (no &apos;); German splits the apostrophe off both sides, English keeps 's
    assert toks[toks.index("Joe"):toks.index("Joe") + 3] == ["Joe", "'", "s"]
    assert not any("&" in t for t in toks)
    assert tokenise("Trader Joe's bag", "en") == ["Trader", "Joe", "'s", "bag"]
    assert "U-Bahn" not in toks and ["U", "@-@", "Bahn"] == toks[toks.index("U"):toks.index("U") + 3]
    assert tokenise("Ein Hund, der „spielt“ & läuft.", "de") == [
        "Ein", "Hund", ",", "der", "„", "spielt", "“", "&", "läuft", "."]


def test_cased_text_is_kept():
    assert tokenise("Two young, White males", "en") == ["Two", "young", ",", "White", "males"]


def test_tokenisation_round_trip_on_real_val(real_data_dir):
    """Detokenising gives back the raw line for nearly every sentence, and re-tokenising the
    detokenised text always gives back the same tokens (so hypotheses written detokenised
    score the same as their tokens)."""
    for lang in ("en", "de"):
        src, tgt = m30k.read_split(real_data_dir, "val", "en", "de", drop_last_line=False)
        lines = src if lang == "en" else tgt
        same = sum(detokenise(tokenise(x, lang), lang) == x for x in lines)
        assert same >= 0.99 * len(lines), (lang, same)
        for x in lines:
            toks = tokenise(x, lang)
            assert tokenise(detokenise(toks, lang), lang) == toks
    assert detokenise(["3", "@-@", "4", "Jahre", "alt", "."], "de") == "3-4 Jahre alt."
    assert tokenise("   ", "en") == [] and detokenise([], "de") == ""


# ---------------------------------------------------------------- files and the last-line rule

def test_last_line_rule_on_the_fixture():
    src, tgt = m30k.read_split(FIXTURES, "train", "en", "de", drop_last_line=True, verify=False)
    assert len(src) == len(tgt) == 10 and src[-1] == "Two women drink coffee at a café."
    src, _ = m30k.read_split(FIXTURES, "train", "en", "de", drop_last_line=False, verify=False)
    assert src[-1] == "The dropped last line."
    test, _ = m30k.read_split(FIXTURES, "test", "en", "de", drop_last_line=True, verify=False)
    assert len(test) == 10  # never applied to the test file


def test_last_line_rule_is_seds(tmp_path):
    """sed -i "$ d" deletes the last line whatever it holds: a trailing empty line if the
    file ends with one, else the last sentence."""
    d = tmp_path / "multi30k"
    d.mkdir()
    (d / "val.en").write_text("a b\nc d\n\n", encoding="utf-8")
    (d / "val.de").write_text("x y\nz w\n\n", encoding="utf-8")
    src, tgt = m30k.read_split(tmp_path, "val", "en", "de", drop_last_line=True, verify=False)
    assert (src, tgt) == (["a b", "c d"], ["x y", "z w"])


def test_real_split_sizes_with_the_rule(real_data_dir):
    sizes = {s: len(m30k.read_split(real_data_dir, s, "en", "de", drop_last_line=True)[0])
             for s in ("train", "val", "test")}
    assert sizes == {"train": 28_999, "val": 1_013, "test": 1_000}


def test_misaligned_files_are_a_data_error(tmp_path):
    d = tmp_path / "multi30k"
    d.mkdir()
    (d / "train.en").write_text("a\nb\nc\n", encoding="utf-8")
    (d / "train.de").write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        m30k.read_split(tmp_path, "train", "en", "de", drop_last_line=True, verify=False)


def test_checksum_mismatch_is_named(tmp_path):
    d = tmp_path / "multi30k"
    d.mkdir()
    for lang in ("en", "de"):
        (d / f"val.{lang}").write_text("not the real file\n", encoding="utf-8")
    with pytest.raises(DataError, match="val.en"):
        m30k.read_split(tmp_path, "val", "en", "de", drop_last_line=True, verify=True)


# ---------------------------------------------------------------- the length filter

def _write_corpus(root: Path, train: list[tuple[str, str]], val=None, test=None) -> Path:
    d = root / "multi30k"
    d.mkdir(parents=True)
    val = val or [("a b", "x y")]
    test = test or [("a b", "x y")]
    for split, pairs in (("train", train), ("val", val), ("test_2016_flickr", test)):
        extra = [] if split.startswith("test") else [("LAST", "LAST")]  # the rule deletes it
        for i, lang in enumerate(("en", "de")):
            (d / f"{split}.{lang}").write_text(
                "".join(p[i] + "\n" for p in pairs + extra), encoding="utf-8")
    return root


def test_pairs_over_50_tokens_are_dropped_from_train_and_val(tmp_path):
    long51 = " ".join(f"w{i}" for i in range(51))
    long50 = " ".join(f"v{i}" for i in range(50))
    root = _write_corpus(tmp_path, [("short one", "kurz eins"), (long51, "lang"),
                                    ("ok", long50), ("", "leer")],
                         val=[("a b", "x y"), ("c " * 60, "z")], test=[("c " * 60, "z")])
    task = NMTTask(NMTData(verify=False), NMTModelConfig(), root)
    art = task.build_artefacts()
    assert art["train_pairs"] == 2  # the 51-token source and the empty source are dropped
    assert "w0" not in art["src_vocab"] and "v49" in art["tgt_vocab"]
    task.use_artefacts(art)
    task.setup(["train", "val", "test"])
    assert task.splits["train"].ppl_index == [0, 2]
    assert task.splits["val"].ppl_index == [0]  # preprocess.py filtered valid too
    assert task.splits["test"].ppl_index == [0]  # translate.py reads every test line
    batches = [b for b in task.train_plan(0, torch.Generator().manual_seed(0))]
    assert sum(b["src"].shape[0] for b in batches) == 2
    assert m30k.keep_pair(["a"] * 50, ["b"] * 50, 50) and not m30k.keep_pair(["a"] * 51, ["b"], 50)
    assert not m30k.keep_pair([], ["b"], 50)


# ---------------------------------------------------------------- vocabularies

def test_vocab_order_caps_and_specials():
    sents = [["b", "a", "c", "a"], ["c", "d", "a"], ["e", "b"]]
    v = Vocab.build(sents, TGT_SPECIALS, max_size=50_000)
    # specials, then by frequency (a:3; b,c:2; d,e:1), ties in code-point order
    assert v.itos == ["<unk>", "<blank>", "<s>", "</s>", "a", "b", "c", "d", "e"]
    assert (v.unk, v.pad, v.bos, v.eos) == (0, 1, 2, 3)
    capped = Vocab.build(sents, SRC_SPECIALS, max_size=2)  # the cap does not count specials
    assert capped.itos == ["<unk>", "<blank>", "a", "b"]
    assert capped.encode(["a", "c", "zzz"]) == [2, 0, 0]
    assert Vocab.build(sents, SRC_SPECIALS, 10, min_freq=2).itos == ["<unk>", "<blank>", "a", "b", "c"]
    assert Vocab.build([["<unk>", "x"]], SRC_SPECIALS, 10).itos == ["<unk>", "<blank>", "x"]
    with pytest.raises(DataError, match="special words"):
        Vocab(["a", "<unk>", "<blank>"], SRC_SPECIALS)


def test_real_vocab_sizes_are_below_the_cap(real_data_dir):
    task = NMTTask(NMTData(), NMTModelConfig(), real_data_dir)
    art = task.build_artefacts()
    # every training word of both sides fits in 50,000: nothing is cut at the paper's size
    _, _, src, tgt = task._read("train")
    kept = task._kept("train")
    assert art["train_pairs"] == len(kept) and 28_900 < len(kept) <= 28_999
    assert len(art["src_vocab"]) == 2 + len({w for i in kept for w in src[i]})
    assert len(art["tgt_vocab"]) == 4 + len({w for i in kept for w in tgt[i]})
    counts = Counter(w for i in kept for w in tgt[i])
    assert art["tgt_vocab"][4] == counts.most_common(1)[0][0]


# ---------------------------------------------------------------- batches

def test_training_batches_are_torchtexts_pools_of_100_batches():
    """OpenNMT-py's order: the core's pooled_batches (tested in test_batching.py) over the
    kept pairs' source lengths, torchtext's 100 batches per pool."""
    task = NMTTask(NMTData(verify=False, batch_size=3), NMTModelConfig(), FIXTURES)
    task.use_artefacts(task.build_artefacts())
    task.setup(["train"])
    sd = task.splits["train"]
    plan = task.train_plan(4, torch.Generator().manual_seed(4))
    want = pooled_batches([len(sd.src_ids[i]) for i in sd.ppl_index], 3,
                          torch.Generator().manual_seed(4), POOL_BATCHES)
    assert POOL_BATCHES == 100 and plan.groups == [[sd.ppl_index[j] for j in g] for g in want]
    assert sorted(i for g in plan.groups for i in g) == sorted(sd.ppl_index)


def test_collate_pads_and_shifts():
    b = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], src_pad=1, tgt_pad=1, bos=2, eos=3)
    assert b["src"].tolist() == [[5, 6, 7], [8, 1, 1]]
    assert b["src_lengths"].tolist() == [3, 1]
    assert b["tgt_in"].tolist() == [[2, 9, 10, 1], [2, 11, 12, 13]]
    assert b["tgt_out"].tolist() == [[9, 10, 3, 1], [11, 12, 13, 3]]
