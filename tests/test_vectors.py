"""Pretrained vectors as catalogued data (tasks/vectors.py): the GloVe entries, the message for
a missing file, checksum verification, fetching one member of a zip archive, the parser reading
a GloVe-format fixture, and report rows marked when a run went without the original's vectors."""

from __future__ import annotations

import functools
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest
import yaml

import lstmablate.data as D
from lstmablate.cells import build_encoder
from lstmablate.errors import DataError
from lstmablate.results.report import build_report
from lstmablate.results.formats import render_report
from lstmablate.run.runs import RunFiles
from lstmablate.task import available_datasets
from lstmablate_tasks.vectors import GLOVE_6B_100D, GLOVE_840B_300D, catalogue_entry, pretrained_path

HERE = Path(__file__).parent
VECTORS = HERE / "fixtures" / "vectors"
RECORDS = HERE.parent / "experiments" / "results"


def test_the_glove_catalogue_entries():
    (f6,), (f8,) = GLOVE_6B_100D.files, GLOVE_840B_300D.files
    assert (f6.relpath, f6.size, f6.checksum) == (
        "glove/glove.6B.100d.txt", 347_116_733, ("sha1", "16b1dbfaf35476790bd9df40c83e2dfbd05312f1"))
    assert (f8.relpath, f8.size, f8.checksum) == (
        "glove/glove.840B.300d.txt", 5_646_236_541, ("sha1", "294b9f37fa64cce31f9ebb409c266fc379527708"))
    assert f6.url.endswith("glove.6B.zip") and f6.url_zip_member == "glove.6B.100d.txt"
    assert f8.url.endswith("glove.840B.300d.zip") and f8.url_zip_member == "glove.840B.300d.txt"
    for ds in (GLOVE_6B_100D, GLOVE_840B_300D):
        assert "Public Domain Dedication and License" in ds.licence
        assert available_datasets()[ds.name] == ds  # `lstmablate data fetch glove-...`
    assert catalogue_entry("glove/glove.6B.100d.txt") == (GLOVE_6B_100D, f6)
    assert catalogue_entry("/elsewhere/glove.840B.300d.txt.gz") == (GLOVE_840B_300D, f8)
    assert catalogue_entry("my_vectors.txt") is None


def test_a_missing_vectors_file_says_how_to_get_it_and_how_to_run_without(tmp_path):
    with pytest.raises(DataError) as exc:
        pretrained_path(tmp_path, "glove/glove.6B.100d.txt",
                        original="Parser-v1 adds GloVe 6B 100d to its word embeddings.")
    msg = str(exc.value)
    for part in (str(tmp_path / "glove" / "glove.6B.100d.txt"), "Parser-v1 adds GloVe 6B 100d",
                 "lstmablate data fetch glove-6b-100d", "https://nlp.stanford.edu/data/glove.6B.zip",
                 "--set model.pretrained=", "`lstmablate report` marks every such run"):
        assert part in msg
    with pytest.raises(DataError, match=r"Give the path of a GloVe-format text file"):
        pretrained_path(tmp_path, "mine.txt")


def test_a_catalogued_file_is_verified_and_gz_is_accepted(tmp_path):
    p = tmp_path / "glove" / "glove.6B.100d.txt"
    p.parent.mkdir()
    p.write_text("the 0.1 0.2\n")
    with pytest.raises(DataError, match="checksum mismatch .*sha1 .*glove-6b-100d"):
        pretrained_path(tmp_path, "glove/glove.6B.100d.txt")
    assert pretrained_path(tmp_path, "glove/glove.6B.100d.txt", verify=False) == p
    mine = tmp_path / "mine.txt.gz"
    mine.write_bytes(b"")
    assert pretrained_path(tmp_path, "mine.txt") == mine  # not catalogued: not checksummed


def test_fetch_keeps_one_member_of_a_zip_archive(tmp_path):
    member = (VECTORS / "glove.parsing.8d.txt").read_bytes()
    archive = tmp_path / "remote.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("other.txt", "not this one\n")
        z.writestr("vectors.txt", member)
    df = D.DataFile("toy/vectors.txt", None, None, url=archive.as_uri(), url_zip_member="vectors.txt",
                    sha1=hashlib.sha1(member).hexdigest())
    ds = D.Dataset("toy-vectors", (df,), url="file://", licence="none", fetch_hint="copy it")
    dest = tmp_path / "data"
    (path,) = D.fetch(ds, dest, log=None)
    assert path == dest / "toy" / "vectors.txt" and path.read_bytes() == member
    assert sorted(p.name for p in (dest / "toy").iterdir()) == ["vectors.txt"]  # no leftovers
    bad = D.Dataset("toy-bad", (D.DataFile("toy2/v.txt", None, None, url=archive.as_uri(),
                                           url_zip_member="absent.txt", sha1="0" * 40),),
                    url="file://", licence="none", fetch_hint="copy it")
    with pytest.raises(DataError, match="not a zip archive holding absent.txt"):
        D.fetch(bad, dest, log=None)
    assert list((dest / "toy2").iterdir()) == []
    with pytest.raises(DataError, match="the download of .* has sha1"):
        D.fetch(D.Dataset("toy-sum", (D.DataFile("toy3/v.txt", None, None, url=archive.as_uri(),
                                                 url_zip_member="other.txt", sha1="0" * 40),),
                          url="file://", licence="none", fetch_hint="copy it"), dest, log=None)


def test_the_parser_reads_a_glove_format_fixture(tmp_path):
    """Parser-v1 keeps every line of the file (after PAD, ROOT, UNK rows), lower-cased lookup."""
    from test_parsing_task import FIXTURES, make_task

    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data / "parsing")
    shutil.copy(VECTORS / "glove.parsing.8d.txt", data / "vec.txt")
    lines = (VECTORS / "glove.parsing.8d.txt").read_text(encoding="utf-8").splitlines()
    task = make_task(data_dir=data, pretrained="vec.txt")
    assert task.pretrained_table.shape == (3 + len(lines), 8)
    feline = task.pretrained_index["feline"]  # not in the treebank, kept as Parser-v1 does
    assert task.pretrained_table[feline].tolist() == pytest.approx(
        [float(v) for v in lines[-1].split()[1:]])
    model = task.build_model(functools.partial(build_encoder, "lstm"))
    assert model.pretrained.shape == (3 + len(lines), 8)
    assert task.evaluate(model, "dev")["words"] > 0


def test_report_marks_rows_trained_without_the_originals_setup(tmp_path):
    """A CPU-scale Table 3 record: no GloVe and every word encoded (``encoder_lengths: all``):
    each row is marked and the deviations are listed; a run with both is not."""
    runs = tmp_path / "runs"
    shutil.copytree(RECORDS / "parsing-ewt-cpu" / "lstm" / "seed-1",
                    runs / "parsing-ewt-cpu" / "lstm" / "seed-1")
    report = build_report(runs, "parsing-ewt-cpu")
    (row,) = [r for r in report.tables[0].rows if r.cell == "lstm"]
    assert row.deviations == ["no pretrained vectors (Parser-v1 adds GloVe 6B 100d)",
                              "every word encoded (Parser-v1 never encodes a sentence's last word)"]
    text = render_report(runs, "parsing-ewt-cpu")
    assert "| `lstm` † § |" in text and "§ not the original system's setup: `lstm`: no pretrained" in text
    assert "\\S{}" in render_report(runs, "parsing-ewt-cpu", fmt="latex")
    assert "no pretrained vectors" in render_report(runs, "parsing-ewt-cpu", fmt="csv")
    cfg_path = RunFiles(runs / "parsing-ewt-cpu" / "lstm" / "seed-1").config
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["model"].update(pretrained="glove/glove.6B.100d.txt", encoder_lengths="parser-v1")
    cfg_path.write_text(yaml.safe_dump(cfg))
    (row,) = [r for r in build_report(runs, "parsing-ewt-cpu").tables[0].rows if r.cell == "lstm"]
    assert row.deviations == []
    assert "§" not in render_report(runs, "parsing-ewt-cpu")
