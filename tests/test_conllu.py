"""The strict CoNLL-U reader on the real UD EWT dev file and on broken lines."""

from __future__ import annotations

import pytest

from lstmablate.errors import DataError
from lstmablate_tasks.parsing.conllu import read_conllu

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
    assert sents[0].heads == [4, 4, 4, 0, 4] and sents[0].deprels[3] == "root"
    assert sents[1].line == 13


@pytest.mark.parametrize("old, new, line, what", [
    ("4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_", "4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_", 7, "9 tab-separated fields"),
    ("5\t.\t.\tPUNCT\t.\t_\t4\tpunct", "6\t.\t.\tPUNCT\t.\t_\t4\tpunct", 9, "word ID 6 should be 5"),
    ("5\t.\t.\tPUNCT\t.\t_\t4\tpunct", "5\t.\t.\tPUNCT\t.\t_\t9\tpunct", 9, "HEAD 9 of word 5"),
    ("1\tI\tI\tPRON\tPRP\t_\t4\tnsubj", "x\tI\tI\tPRON\tPRP\t_\t4\tnsubj", 3, "ID 'x'"),
    ("3\tn't\tnot\tPART\tRB\t_\t4\tadvmod", "3\tn't\tnot\tPART\tRB\t_\tfour\tadvmod", 6, "HEAD 'four'"),
])
def test_malformed_lines_are_named(tmp_path, old, new, line, what):
    p = tmp_path / "bad.conllu"
    assert old in GOOD
    p.write_text(GOOD.replace(old, new))
    with pytest.raises(DataError) as e:
        read_conllu(p)
    assert f"bad.conllu, line {line}" in str(e.value) and what in str(e.value)


def test_real_ud_ewt_dev(real_data_dir):
    sents = read_conllu(real_data_dir / "ud-ewt" / "en_ewt-ud-dev.conllu.gz")
    assert len(sents) == 2001
    assert all(s.heads.count(0) >= 1 for s in sents)
