"""Corrupt data is refused before training, with the file and the line, for every task.

Each case writes a tiny data directory to ``tmp_path`` (the fixtures of ``tests/fixtures/``,
one file damaged), runs ``lstmablate train`` in-process and expects exit code 2, one message
naming the file and the line (and the column and value where there is one), no traceback,
and no run folder: the damage is found while the data are read, before the first step.

* NUL bytes in the text files of PTB, NMT, SST, CoNLL-U (parsing) and BWB (one check in
  ``lstmablate.data``, which every task reads through);
* pretrained word vectors holding NaN, an infinity or 1e300 (parsing, SST, SQuAD), or none
  at all (an empty SST vectors file): one reader, ``lstmablate_tasks.vectors``;
* an SST-2 split left empty by dropping its neutral sentences;
* SQuAD: a blank question (the reader's other cases, an article without paragraphs and a
  context longer than spaCy tokenises, are in ``test_data_checked_before_training.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lstmablate.errors import DataError

from cli_in_process import expect_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures"


def refused_first(r, *fragments) -> str:
    """:func:`expect_error`, and the error is the first thing the command printed: the damage
    was found while the data were read, before the run's header line or any training."""
    text = expect_error(r, *fragments)
    assert text.startswith("error:"), text
    return text


def train(tmp_path: Path, task: str, *sets: str):
    """``lstmablate train --task TASK`` on ``tmp_path/data``, small sizes given by ``sets``."""
    return run_cli("train", "--task", task, "--data-dir", "data", "--out", "runs", "--threads", "1",
                   *[a for s in sets for a in ("--set", s)], "--set", "train.max_steps=2",
                   cwd=tmp_path)


# ------------------------------------------------------------------ the tasks' data directories
BWB_SETS = ("data.vocab_size=0", "data.batch_size=8", "data.num_steps=6", "model.emb_size=16",
            "model.hidden_size=32", "model.proj_size=12", "model.num_sampled=10")
#: task -> (fixture folder, its place in the data directory, the file to damage, settings)
TASKS = {
    "ptb": ("ptb", "ptb", "ptb/ptb.valid.txt",
            ("data.verify=false", "data.batch_size=2", "data.num_steps=3",
             "model.hidden_size=8")),
    "nmt": ("nmt/multi30k", "multi30k", "multi30k/val.de",
            ("data.verify=false", "model.word_vec_size=8", "model.hidden_size=8")),
    "sst": ("sst", "sst", "sst/dev.txt",
            ("data.verify=false", "model.embedding_size=3", "model.hidden_size=4",
             "model.mlp_hidden=4")),
    "parsing": ("parsing", "ud", "ud/dev.conllu",
                ("data.files=ud", "model.word_size=8", "model.tag_size=8", "model.hidden_size=8",
                 "model.num_layers=1", "model.arc_mlp=8", "model.rel_mlp=8")),
    "bwb": ("bwb/bwb", "bwb", "bwb/heldout-monolingual.tokenized.shuffled/"
            "news.en.heldout-00000-of-00050", BWB_SETS),
}


def data_dir(tmp_path: Path, task: str) -> Path:
    """``tmp_path/data`` holding ``task``'s fixture; returns the file the cases damage."""
    fixture, place, damaged, _ = TASKS[task]
    shutil.copytree(FIXTURES / fixture, tmp_path / "data" / place)
    return tmp_path / "data" / damaged


# ------------------------------------------------------------------ NUL bytes

@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_nul_byte_in_a_text_file_is_refused_with_its_line_and_column(tmp_path, task):
    path = data_dir(tmp_path, task)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:3] + b"\x00" + lines[1][3:]  # line 2, column 4
    path.write_bytes(b"\n".join(lines))
    text = refused_first(train(tmp_path, task, *TASKS[task][3]),
                         "line 2: a NUL character (byte 0x00) at column 4")
    assert path.name in text
    assert not (tmp_path / "runs").exists()


def test_a_nul_byte_in_a_gzipped_file_is_found_after_decompression(tmp_path):
    import gzip

    path = data_dir(tmp_path, "ptb")
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(
        path.read_bytes().replace(b"\n", b"\n\x00", 1)))
    path.unlink()
    refused_first(train(tmp_path, "ptb", *TASKS["ptb"][3]),
                  "ptb.valid.txt.gz, line 2: a NUL character (byte 0x00) at column 1")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ pretrained vectors
#: what a damaged vectors file may hold where a number goes, and the words of the message
BAD_NUMBERS = {"nan": "which is not a finite number", "inf": "which is not a finite number",
               "-inf": "which is not a finite number", "1e300": "larger in magnitude than 10000",
               "1e5": "larger in magnitude than 10000", "0x1p3": "which is not a number"}


@pytest.mark.parametrize("bad", sorted(BAD_NUMBERS))
def test_the_parser_refuses_vectors_that_are_not_finite_numbers(tmp_path, bad):
    """The parser keeps every line of the file, so every number is checked."""
    from lstmablate_tasks.parsing.data import read_pretrained

    p = tmp_path / "vec.txt"
    p.write_text(f"the 0.5 -1.25\ncat 0.25 {bad}\n")
    with pytest.raises(DataError) as e:
        read_pretrained(p)
    assert (f"vec.txt, line 2, column 10: the vector of 'cat' holds {bad!r} (number 2 of 2), "
            f"{BAD_NUMBERS[bad]}") in str(e.value)


def test_parsing_with_a_nan_in_its_vectors_fails_before_training(tmp_path):
    """The issue's run: every step was skipped (NaN loss), yet result.json got test numbers."""
    data_dir(tmp_path, "parsing")
    lines = (FIXTURES / "vectors" / "glove.parsing.8d.txt").read_text(encoding="utf-8").splitlines()
    lines[4] = " ".join(lines[4].split(" ")[:3] + ["NaN"] + lines[4].split(" ")[4:])
    (tmp_path / "data" / "vec.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    word = lines[4].split(" ")[0]
    text = refused_first(train(tmp_path, "parsing", *TASKS["parsing"][3], "model.pretrained=vec.txt"),
                         "vec.txt, line 5, column", f"the vector of {word!r} holds 'NaN' "
                         "(number 3 of 8), which is not a finite number")
    assert "replace it with a good copy" in text
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content, what", [
    ("", "is empty (0 bytes)"),
    ("\n\n  \n", "holds no word vectors, only blank lines"),
    ("gorgeous 1 2 inf\n", "line 1, column 14: the vector of 'gorgeous' holds 'inf' (number 3 of 3)"),
    ("gorgeous 1 2\n", "line 1: 2 numbers after the word, expected 3 (model.embedding_size)"),
    ("1 2 3\n", "line 1: 2 numbers after the word, expected 3"),
])
def test_sst_refuses_an_empty_or_damaged_vectors_file_before_training(tmp_path, content, what):
    data_dir(tmp_path, "sst")
    (tmp_path / "data" / "vec.txt").write_text(content)
    refused_first(train(tmp_path, "sst", *TASKS["sst"][3], "model.pretrained=vec.txt"),
                  "vec.txt", what)
    assert not (tmp_path / "runs").exists()


def test_sst_checks_only_the_numbers_it_keeps(tmp_path):
    """A damaged line of a word outside the vocabulary is never converted (glove.840B has 660
    million numbers): the run trains."""
    data_dir(tmp_path, "sst")
    (tmp_path / "data" / "vec.txt").write_text("gorgeous 1 2 3\nzyzzyva nan nan nan\n")
    r = train(tmp_path, "sst", *TASKS["sst"][3], "model.pretrained=vec.txt")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("bad", ["nan", "-inf", "1e300"])
def test_squad_refuses_vectors_that_are_not_finite_numbers(tmp_path, bad):
    from lstmablate_tasks.squad.vocab import Vocab, read_vectors

    p = tmp_path / "glove.txt"
    p.write_text(f"the 0.1 0.2\n. . . 0.3 {bad}\n")
    with pytest.raises(DataError, match=rf"glove.txt, line 2, column 11: the vector of '\. \. \.' "
                                        rf"holds '{bad}' \(number 2 of 2\)"):
        read_vectors(p, 2, Vocab(["<PAD>", "<UNK>", "the", ". . ."]), "model.word_dim")
    assert read_vectors(p, 2, Vocab(["<PAD>", "<UNK>", "the"]))[1] == 1  # not kept: not read


def test_squad_drqa_with_an_infinite_vector_fails_before_training(tmp_path):
    shutil.copytree(FIXTURES / "squad" / "squad", tmp_path / "data" / "squad")
    (tmp_path / "data" / "vec.txt").write_text("the 0.5 0.5 0.5 0.5\nWarsaw 1 2 inf 4\n")
    r = train(tmp_path, "squad-drqa", "data.verify=false", "data.tokenizer=regex",
              "model.embedding_dim=4", "model.hidden_size=4", "model.doc_layers=1",
              "model.question_layers=1", "model.pretrained=vec.txt")
    refused_first(r, "vec.txt, line 2, column 12: the vector of 'Warsaw' holds 'inf'")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ SST-2 without examples

def test_an_sst2_dev_set_of_neutral_sentences_is_refused(tmp_path):
    """SST-2 drops neutral sentences: a dev file of only neutral ones would be scored over none."""
    dev = data_dir(tmp_path, "sst")
    dev.write_text("(2 (2 It) (2 (2 opens) (2 Friday)))\n(2 (2 A) (2 film))\n")
    refused_first(train(tmp_path, "sst", *TASKS["sst"][3], "data.classes=2"),
                  "dev.txt: every sentence of its 2 trees is neutral (label 2)",
                  "the dev split would hold no example", "--set data.classes=5")
    assert not (tmp_path / "runs").exists()
    r = train(tmp_path, "sst", *TASKS["sst"][3], "data.classes=5")  # the advice works
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ SQuAD


def test_squad_with_an_empty_question_fails_before_training(tmp_path):
    shutil.copytree(FIXTURES / "squad" / "squad", tmp_path / "data" / "squad")
    train_file = tmp_path / "data" / "squad" / "train-v1.1.json"
    doc = json.loads(train_file.read_text(encoding="utf-8"))
    qa = doc["data"][0]["paragraphs"][1]["qas"][2]
    qa["question"] = "   "
    train_file.write_text(json.dumps(doc), encoding="utf-8")
    r = train(tmp_path, "squad-drqa", "data.verify=false", "data.tokenizer=regex",
              "model.embedding_dim=4", "model.hidden_size=4", "model.doc_layers=1",
              "model.question_layers=1")
    refused_first(r, "train-v1.1.json", f"question {qa['id']!r} (article 0 ('Warsaw'), "
                  "paragraph 1) is only white space")
    assert not (tmp_path / "runs").exists()
