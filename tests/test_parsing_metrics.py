"""UAS/LAS under the three punctuation conventions, on hand-built gold/predicted pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.parsing.conllu import read_conllu, write_conllu
from lstmablate_tasks.parsing.metrics import (PARSER_V1_PUNCT, attachment_scores, score_files,
                                              scored)

FIXTURES = Path(__file__).parent / "fixtures" / "parsing"


def fixture(name: str):
    """The fixture sentence with sent_id ``name``."""
    for s in read_conllu(FIXTURES / "train.conllu", keep_lines=True):
        if f"# sent_id = {name}" in s.lines:
            return s
    raise KeyError(name)


def test_parser_v1_punctuation_set_is_by_gold_xpos():
    assert PARSER_V1_PUNCT == {"``", "''", ":", ",", ".", "PU", "PUNCT"}
    assert not scored("", ".", "PUNCT") and not scored("", "``", "PUNCT")
    # PTB tags that UD calls PUNCT but Parser-v1 scores
    for xpos in ("HYPH", "-LRB-", "-RRB-", "NFP"):
        assert scored("", xpos, "PUNCT") and not scored("_upos", xpos, "PUNCT")
    assert scored("_all", ".", "PUNCT")


def test_hand_built_scores_with_punctuation():
    song = fixture("song")  # A well - known ( old ) song .   (- ( ) are HYPH -LRB- -RRB-)
    go = fixture("go")  # `` Go '' , he said :
    assert song.xpos == ["DT", "RB", "HYPH", "VBN", "-LRB-", "JJ", "-RRB-", "NN", "."]
    heads = list(song.heads)
    rels = list(song.deprels)
    heads[2] = 2  # '-' (HYPH): wrong head
    heads[8] = 4  # '.': wrong head
    rels[4] = "dep"  # '(' (-LRB-): right head, wrong relation
    rels[0] = "nsubj"  # 'A': right head, wrong relation
    res = attachment_scores([song], [heads], [rels])
    # Parser-v1: words 1-8 scored ('.' is not): heads right 7/8; both right 5/8
    assert res["uas"] == pytest.approx(100 * 7 / 8) and res["las"] == pytest.approx(100 * 5 / 8)
    # all 9 words: heads 7/9, both 5/9
    assert res["uas_all"] == pytest.approx(100 * 7 / 9) and res["las_all"] == pytest.approx(100 * 5 / 9)
    # UPOS != PUNCT: A well known old song; heads 5/5, both 4/5 ('A' has the wrong relation)
    assert res["uas_upos"] == pytest.approx(100.0) and res["las_upos"] == pytest.approx(80.0)
    assert res["words"] == 9 and res["scored_words"] == 8
    # a perfect second sentence of mostly punctuation: micro-averaged over words
    both = attachment_scores([song, go], [heads, go.heads], [rels, go.deprels])
    assert both["uas"] == pytest.approx(100 * (7 + 3) / (8 + 3))  # go: Go he said
    assert both["las"] == pytest.approx(100 * (5 + 3) / (8 + 3))
    assert both["uas_all"] == pytest.approx(100 * (7 + 7) / (9 + 7))
    assert both["las_upos"] == pytest.approx(100 * (4 + 3) / (5 + 3))


def test_las_compares_full_relation_labels():
    cat = fixture("cat")
    rels = list(cat.deprels)
    rels[5] = "obl:tmod"  # gold obl
    res = attachment_scores([cat], [cat.heads], [rels])
    assert res["uas"] == 100.0 and res["las"] == pytest.approx(100 * 5 / 6)


def test_scores_from_files_equal_the_in_memory_scores(tmp_path):
    gold_path = FIXTURES / "test.conllu"
    gold = read_conllu(gold_path, keep_lines=True)
    # a right-branching chain (word i headed by i + 1, the last word the root): a tree,
    # mostly wrong heads; every other relation replaced
    heads = [[i + 2 if i + 1 < len(s) else 0 for i in range(len(s))] for s in gold]
    rels = [["punct" if j % 2 else r for j, r in enumerate(s.deprels)] for s in gold]
    pred = tmp_path / "pred.conllu"
    write_conllu(pred, gold, heads, rels)
    from_file = score_files(gold_path, pred)
    assert from_file == attachment_scores(gold, heads, rels)
    assert 0 < from_file["uas_all"] < 100
    write_conllu(pred, gold, [s.heads for s in gold], [s.deprels for s in gold])
    perfect = score_files(gold_path, pred)
    assert perfect["las"] == perfect["uas_all"] == perfect["las_upos"] == 100.0


def test_mismatched_predictions_file_is_named(tmp_path):
    gold_path = FIXTURES / "test.conllu"
    gold = read_conllu(gold_path, keep_lines=True)
    pred = tmp_path / "pred.conllu"
    write_conllu(pred, gold[:2], [s.heads for s in gold[:2]], [s.deprels for s in gold[:2]])
    with pytest.raises(DataError, match="has 2 sentences, the gold file .* 3"):
        score_files(gold_path, pred)
    write_conllu(pred, gold, [s.heads for s in gold], [s.deprels for s in gold])
    pred.write_text(pred.read_text().replace("\tbark\t", "\tbarks\t"))
    with pytest.raises(DataError, match=r"pred.conllu, line \d+: the words of this sentence differ"):
        score_files(gold_path, pred)
