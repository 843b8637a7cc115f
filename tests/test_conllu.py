"""The strict CoNLL-U reader and the predictions writer, on hand-made files and real UD EWT."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.parsing.conllu import conllu_text, read_conllu, write_conllu

FIXTURES = Path(__file__).parent / "fixtures" / "parsing"

GOOD = """# sent_id = 1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
4.1\tit\tit\tPRON\tPRP\t_\t_\t_\t4:obj\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

"""


def test_reads_words_heads_and_skips_ranges_and_empty_nodes(tmp_path):
    p = tmp_path / "a.conllu"
    p.write_text(GOOD + GOOD.replace("sent_id = 1", "sent_id = 2"))
    sents = read_conllu(p)
    assert len(sents) == 2
    assert sents[0].words == ["I", "do", "n't", "know", "."]
    assert sents[0].upos == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert sents[0].xpos == ["PRP", "VBP", "RB", "VB", "."]
    assert sents[0].heads == [4, 4, 4, 0, 4] and sents[0].deprels[3] == "root"
    assert sents[1].line == 11 and sents[1].word_lines == [13, 15, 16, 17, 19]


def test_gzip_is_read_like_plain(tmp_path):
    p = tmp_path / "a.conllu.gz"
    p.write_bytes(gzip.compress(GOOD.encode()))
    assert read_conllu(p)[0].words == ["I", "do", "n't", "know", "."]


@pytest.mark.parametrize("old, new, line, what", [
    ("4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_", "4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_", 7,
     "9 tab-separated fields"),
    ("5\t.\t.\tPUNCT\t.\t_\t4\tpunct", "6\t.\t.\tPUNCT\t.\t_\t4\tpunct", 9, "word ID 6 should be 5"),
    ("5\t.\t.\tPUNCT\t.\t_\t4\tpunct", "5\t.\t.\tPUNCT\t.\t_\t9\tpunct", 9, "HEAD 9 of word 5"),
    ("1\tI\tI\tPRON\tPRP\t_\t4\tnsubj", "x\tI\tI\tPRON\tPRP\t_\t4\tnsubj", 3, "ID 'x'"),
    ("3\tn't\tnot\tPART\tRB\t_\t4\tadvmod", "3\tn't\tnot\tPART\tRB\t_\tfour\tadvmod", 6, "HEAD 'four'"),
    ("3\tn't\tnot\tPART\tRB\t_\t4\tadvmod", "3\tn't\tnot\tPART\tRB\t_\t3\tadvmod", 6, "its own HEAD"),
    ("3\tn't\tnot\tPART\tRB\t_\t4\tadvmod", "3\tn't\tnot\tPART\tRB\t_\t4\t_", 6, "DEPREL is empty"),
    ("2-3\tdon't", "3-4\tdon't", 4, "multiword token 3-4 should cover words 2-N"),
    # two roots, no root, a cycle: not a basic UD tree
    ("1\tI\tI\tPRON\tPRP\t_\t4\tnsubj", "1\tI\tI\tPRON\tPRP\t_\t0\tnsubj", 1,
     "2 words (IDs [1, 4]) have HEAD 0"),
    ("4\tknow\tknow\tVERB\tVB\t_\t0\troot", "4\tknow\tknow\tVERB\tVB\t_\t5\troot", 1, "no word has HEAD 0"),
    ("# text = I don't know.", "# text = I don't know.\n \t", 3, "only white space"),
])
def test_malformed_lines_are_named(tmp_path, old, new, line, what):
    p = tmp_path / "bad.conllu"
    assert old in GOOD
    p.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(DataError) as e:
        read_conllu(p)
    assert f"bad.conllu, line {line}" in str(e.value) and what in str(e.value)


def test_cycle_is_reported_at_a_word_on_it(tmp_path):
    # 1 -> 2 -> 1 while 3 is the root: the walk from word 1 meets the cycle at word 1
    text = ("1\ta\ta\tX\tX\t_\t2\tdep\t_\t_\n2\tb\tb\tX\tX\t_\t1\tdep\t_\t_\n"
            "3\tc\tc\tX\tX\t_\t0\troot\t_\t_\n\n")
    p = tmp_path / "cyc.conllu"
    p.write_text(text)
    with pytest.raises(DataError, match=r"cyc.conllu, line 1: .*word 1 is on a cycle"):
        read_conllu(p)


def test_crlf_line_endings_are_rejected(tmp_path):
    p = tmp_path / "win.conllu"
    p.write_bytes(GOOD.replace("\n", "\r\n").encode())
    with pytest.raises(DataError, match=r"win.conllu, line 1: .*CR LF"):
        read_conllu(p)


@pytest.mark.parametrize("ending, line, what", [
    ("\n", 9, "the last sentence is not followed by a blank line"),
    ("", 9, "the last sentence is not followed by a blank line"),
])
def test_last_sentence_needs_its_blank_line(tmp_path, ending, line, what):
    p = tmp_path / "cut.conllu"
    p.write_text(GOOD.rstrip("\n") + ending)
    with pytest.raises(DataError) as e:
        read_conllu(p)
    assert f"cut.conllu, line {line}" in str(e.value) and what in str(e.value)


def test_trailing_comments_and_empty_files(tmp_path):
    p = tmp_path / "c.conllu"
    p.write_text(GOOD + "# dangling\n")
    with pytest.raises(DataError, match="comment lines with no token lines"):
        read_conllu(p)
    p.write_text("\n\n")
    with pytest.raises(DataError, match="no sentences found"):
        read_conllu(p)


def test_writer_replaces_heads_and_relations_and_keeps_the_rest(tmp_path):
    sents = read_conllu(FIXTURES / "test.conllu", keep_lines=True)
    heads = [[0] + [1] * (len(s) - 1) for s in sents]
    rels = [["root"] + ["dep"] * (len(s) - 1) for s in sents]
    out = tmp_path / "pred.conllu"
    write_conllu(out, sents, heads, rels)
    back = read_conllu(out)
    assert [s.words for s in back] == [s.words for s in sents]
    assert [s.heads for s in back] == heads and [s.deprels for s in back] == rels
    assert [s.xpos for s in back] == [s.xpos for s in sents]
    text = out.read_text()
    # comments (with and without '='), multiword tokens and MISC kept; empty nodes and DEPS dropped
    assert "# a comment without an equals sign\n" in text and "2-3\tdon't\t" in text
    assert "5.1\t" not in text and "CopyOf" not in text
    assert "\tSpaceAfter=No\n" in text
    assert all(line.split("\t")[8] == "_" for line in text.splitlines() if "\t" in line)


def test_round_trip_with_gold_trees_is_the_input_minus_enhanced_parts():
    sents = read_conllu(FIXTURES / "train.conllu", keep_lines=True)
    text = conllu_text(sents, [s.heads for s in sents], [s.deprels for s in sents])
    original = (FIXTURES / "train.conllu").read_text().splitlines()
    expected = []
    for line in original:
        cols = line.split("\t")
        if len(cols) == 10:
            if "." in cols[0]:
                continue
            if "-" not in cols[0]:
                cols[8] = "_"
        expected.append("\t".join(cols))
    assert text.splitlines() == expected


def test_real_ud_ewt_dev(real_data_dir):
    sents = read_conllu(real_data_dir / "ud-ewt" / "en_ewt-ud-dev.conllu.gz")
    assert len(sents) == 2001
    assert sum(len(s) for s in sents) == 25147
    assert all(s.heads.count(0) == 1 for s in sents)
