"""Data are checked before training: every split a run reads is non-empty and well-formed before
its first step, so a run never trains for hours and then dies in its final evaluation; and the
readers refuse malformed files with the file and the line (CoNLL-U) or the question (SQuAD).
Running out of memory or of stack is a message too."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from lstmablate.errors import DataError, UserError
from lstmablate.run.runner import train_run

from cli_in_process import expect_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = Console(file=io.StringIO())


# ------------------------------------------------------------------ every split before training

def test_nmt_with_a_one_line_validation_set_fails_before_training(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "nmt" / "multi30k", data / "multi30k")
    for lang in ("en", "de"):  # the recipe drops the last line: nothing is left
        p = data / "multi30k" / f"val.{lang}"
        p.write_text(p.read_text().splitlines()[0] + "\n")
    r = run_cli("train", "--task", "nmt", "--data-dir", "data", "--out", "runs", "--threads", "1",
                "--set", "data.verify=false", "--set", "model.word_vec_size=8", "--set",
                "model.hidden_size=8", "--set", "train.max_steps=2", cwd=tmp_path)
    expect_error(r, "the val split", "multi30k/val.en", "data.drop_last_line")
    assert not (tmp_path / "runs").exists()


def test_bwb_with_an_empty_test_shard_fails_before_training(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "bwb" / "bwb", data / "bwb")
    test_shard = data / "bwb" / "heldout-monolingual.tokenized.shuffled" / "news.en.heldout-00000-of-00050"
    test_shard.write_text("")
    sets = ["data.vocab_size=0", "data.batch_size=8", "data.num_steps=6", "model.emb_size=16",
            "model.hidden_size=32", "model.proj_size=12", "model.num_sampled=10",
            "train.max_steps=2"]
    r = run_cli("train", "--task", "bwb", "--data-dir", "data", "--out", "runs", "--threads", "1",
                *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    text = expect_error(r, "news.en.heldout-00000-of-00050", "empty")
    assert "data fetch bwb" not in text  # the shards cannot be fetched
    assert not (tmp_path / "runs").exists()


def test_parsing_with_a_token_budget_below_one_sentence_trains(tmp_path):
    """data.batch_tokens=1: every sentence is longer than a batch; each goes alone (Parser-v1's
    array_split would give empty batches)."""
    out = train_run("parsing", "lstm", overrides=["data.files=parsing", "data.batch_tokens=1",
                                                  "model.hidden_size=8", "model.num_layers=1",
                                                  "model.arc_mlp=8", "model.rel_mlp=8",
                                                  "model.word_size=8", "model.tag_size=8",
                                                  "train.max_steps=3", "train.eval_every=3"],
                    out=tmp_path / "runs", data_dir=str(FIXTURES), console=QUIET, progress=False,
                    threads=1)
    assert out.result.steps == 3


def test_a_training_split_that_gives_no_batch_fails_before_anything_is_written(tmp_path, monkeypatch):
    """The runner asks every task for its first epoch's plan before the run folder is written."""
    from lstmablate_tasks.dyck.task import DyckTask

    monkeypatch.setattr(DyckTask, "train_plan", lambda self, epoch, generator: [])
    with pytest.raises(DataError, match="give no batch"):
        train_run("dyck", "lstm", overrides=["data.train_sequences=8", "data.train_tokens=0"],
                  out=tmp_path / "runs", console=QUIET, progress=False, threads=1)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ memory and recursion

@pytest.mark.parametrize("error", [
    MemoryError(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 4000000000000 bytes. Error code 12"),
])
def test_running_out_of_memory_is_a_message_and_leaves_no_run_folder(tmp_path, tiny_recipe,
                                                                    monkeypatch, error):
    from lstmablate.run import runner

    def build(task, cfg):
        raise error

    monkeypatch.setattr(runner, "build_model", build)
    with pytest.raises(UserError, match="out of memory while running tiny/lstm/seed-1") as e:
        train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET,
                  progress=False, threads=1)
    assert "batch size" in str(e.value)
    assert not (tmp_path / "runs").exists()


def test_other_runtime_errors_are_not_disguised_as_memory(tmp_path, tiny_recipe, monkeypatch):
    from lstmablate.run import runner

    monkeypatch.setattr(runner, "build_model", lambda task, cfg: (_ for _ in ()).throw(
        RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET,
                  progress=False, threads=1)


# ------------------------------------------------------------------ CoNLL-U

CONLLU = ("# text = I saw her\n"
          "1\tI\tI\tPRON\tPRP\t_\t2\tnsubj\t_\t_\n"
          "2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_\n"
          "3\ther\tshe\tPRON\tPRP\t_\t2\tobj\t_\t_\n\n")


@pytest.mark.parametrize("bad, line, what", [
    (CONLLU.replace("\t2\tnsubj", "\t²\tnsubj"), 2, "HEAD '²' is not a number"),
    (CONLLU.replace("\t2\tobj", "\t٣\tobj"), 4, "HEAD '٣' is not a number"),
    (CONLLU.replace("\tnsubj\t", "\tnsubj x\t"), 2, "DEPREL 'nsubj x' contains white space"),
    (CONLLU + "\n" + CONLLU, 6, "a second empty line after a sentence"),
    (CONLLU.replace("1\tI\tI", "1-99\tIsaw\t_\t_\t_\t_\t_\t_\t_\t_\n1\tI\tI"), 2,
     "the multiword token ends at word 99, but the sentence starting at line 1 has 3 words"),
])
def test_conllu_inputs_the_probe_found_are_refused_with_file_and_line(tmp_path, bad, line, what):
    (tmp_path / "x.conllu").write_text(bad, encoding="utf-8")
    r = run_cli("data", "validate-conllu", "x.conllu", cwd=tmp_path)
    expect_error(r, f"x.conllu, line {line}", what)


def test_a_bad_conllu_head_stops_training_before_the_run_folder(tmp_path):
    data = tmp_path / "data" / "ud"
    shutil.copytree(FIXTURES / "parsing", data)
    p = data / "dev.conllu"
    lines = p.read_text().splitlines(keepends=True)
    i = next(i for i, x in enumerate(lines) if x[:1].isdigit() and x.split("\t")[6] != "0")
    cols = lines[i].split("\t")
    cols[6] = "²"
    lines[i] = "\t".join(cols)
    p.write_text("".join(lines), encoding="utf-8")
    r = run_cli("train", "--task", "parsing", "--data-dir", "data", "--set", "data.files=ud",
                "--out", "runs", "--threads", "1", cwd=tmp_path)
    text = expect_error(r, "HEAD '²'")
    assert f"dev.conllu,line{i + 1}:" in text.replace(" ", "")  # (the path may be wrapped)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ SQuAD

def squad(context: str, answer: str, start: int, version: str = "1.1", question: str = "What?",
          paragraphs: list | None = None) -> str:
    """A SQuAD file of one article: one paragraph and question (or ``paragraphs``)."""
    if paragraphs is None:
        paragraphs = [{"context": context, "qas": [{
            "id": "q1", "question": question,
            "answers": [{"text": answer, "answer_start": start}]}]}]
    return json.dumps({"version": version, "data": [{"title": "T", "paragraphs": paragraphs}]})


CONTEXT = "The cat sat on the mat."


@pytest.mark.parametrize("text, what", [
    (squad(CONTEXT, "The", -len(CONTEXT)), "is not at its answer_start -23"),
    (squad(CONTEXT, "", 10**30), "is empty"),
    (squad(CONTEXT, "", 3), "is empty"),
    (squad(CONTEXT, "cat", 4, version="2.0"), "this task reads SQuAD v1.1"),
    ("[" * 200_000, "nests arrays or objects too deeply"),
    # an empty question, an article without paragraphs, a context spaCy would not tokenise (E088)
    (squad(CONTEXT, "cat", 4, question=""), "question 'q1' (article 0 ('T'), paragraph 0) is empty"),
    (squad(CONTEXT, "cat", 4, question=" \t\n"),
     "question 'q1' (article 0 ('T'), paragraph 0) is only white space"),
    (squad(CONTEXT, "cat", 4, paragraphs=[]), "article 0 ('T') has no paragraphs"),
    (squad(CONTEXT, "cat", 4, paragraphs=[{"context": "  ", "qas": []}]),
     "the context of article 0 ('T'), paragraph 0 is only white space"),
    (squad("cat " * 250_001, "cat", 4),
     "the context of article 0 ('T'), paragraph 0 is 1,000,004 characters long, more than "
     "the 1,000,000"),
])
def test_squad_inputs_the_probe_found_are_refused_with_the_file(tmp_path, text, what):
    from lstmablate_tasks.squad.data import read_squad

    p = tmp_path / "dev-v1.1.json"
    p.write_text(text)
    with pytest.raises(DataError) as e:
        read_squad(p)
    assert str(p) in str(e.value) and what in str(e.value), str(e.value)


def test_a_well_formed_squad_answer_still_reads():
    import tempfile

    from lstmablate_tasks.squad.data import read_squad

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "ok.json"
        p.write_text(squad(CONTEXT, "mat", 19))
        (article,) = read_squad(p)
        assert article.paragraphs[0].questions[0].answers[0].text == "mat"
