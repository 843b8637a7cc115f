"""Tests of lstmablate.data: data-directory resolution, checked reading, checksums, fetch."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

import lstmablate_tasks.ptb.task  # noqa: F401  (its class registers the ptb dataset)
from lstmablate import data as D
from lstmablate.errors import DataError, UnknownNameError
from lstmablate.task import available_datasets

from conftest import skip_without_real_data

FIXTURES = Path(__file__).parent / "fixtures"
PTB_TRAIN = FIXTURES / "ptb" / "ptb.train.txt"


def real_data_dir() -> Path:
    return skip_without_real_data()


def _write_gz(path: Path, payload: bytes) -> Path:
    path.write_bytes(gzip.compress(payload, mtime=0))
    return path


def _entry_for(path: Path, relpath: str, *, sha256: bool = True, url: str | None = None,
               url_gzipped: bool = False) -> D.DataFile:
    content = path.read_bytes()
    return D.DataFile(relpath, hashlib.sha256(content).hexdigest() if sha256 else None,
                      hashlib.md5(content).hexdigest(), url=url, url_gzipped=url_gzipped)


# ---------------------------------------------------------------- resolution


def test_resolution_order_cli_then_env_then_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(D.ENV_VAR, raising=False)
    assert D.resolve_data_dir() == tmp_path / "data"
    assert D.resolve_data_dir(None) == tmp_path / D.DEFAULT_DATA_DIR

    monkeypatch.setenv(D.ENV_VAR, str(tmp_path / "from_env"))
    assert D.resolve_data_dir() == tmp_path / "from_env"
    # --data-dir wins over the environment variable.
    assert D.resolve_data_dir(tmp_path / "from_cli") == tmp_path / "from_cli"
    assert D.resolve_data_dir(str(tmp_path / "from_cli")) == tmp_path / "from_cli"

    # An empty variable counts as unset; a relative value is relative to the cwd.
    monkeypatch.setenv(D.ENV_VAR, "")
    assert D.resolve_data_dir() == tmp_path / "data"
    assert D.resolve_data_dir("rel/dir") == tmp_path / "rel" / "dir"
    assert D.resolve_data_dir("rel/dir").is_absolute()


def test_describe_says_how_the_directory_was_chosen(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(D.ENV_VAR, str(tmp_path / "env_dir"))
    assert D.ENV_VAR in D.describe_data_dir(D.resolve_data_dir())
    assert "--data-dir" in D.describe_data_dir(D.resolve_data_dir(tmp_path / "cli_dir"))
    monkeypatch.delenv(D.ENV_VAR)
    assert "default" in D.describe_data_dir(D.resolve_data_dir())


# ---------------------------------------------------------------- find_file


def test_find_file_plain_gz_and_preference(tmp_path):
    (tmp_path / "ptb").mkdir()
    gz = _write_gz(tmp_path / "ptb" / "ptb.valid.txt.gz", b" a b \n")
    assert D.find_file(tmp_path, "ptb/ptb.valid.txt") == gz
    plain = tmp_path / "ptb" / "ptb.valid.txt"
    plain.write_text(" a b \n")
    assert D.find_file(tmp_path, "ptb/ptb.valid.txt") == plain  # plain preferred


def test_find_file_missing_names_paths_dir_and_remedy(tmp_path, monkeypatch):
    monkeypatch.setenv(D.ENV_VAR, str(tmp_path))
    data_dir = D.resolve_data_dir()
    with pytest.raises(DataError) as exc:
        D.find_file(data_dir, "ptb/ptb.train.txt")
    msg = str(exc.value)
    assert str(tmp_path / "ptb" / "ptb.train.txt") in msg
    assert str(tmp_path / "ptb" / "ptb.train.txt.gz") in msg
    assert f"data directory {tmp_path}" in msg
    assert "set by the environment variable LSTMABLATE_DATA" in msg
    assert "lstmablate data fetch ptb" in msg
    assert "--data-dir" in msg and "LSTMABLATE_DATA" in msg
    assert "\n" not in msg  # one paragraph


# ---------------------------------------------------------------- reading


def test_gz_and_plain_read_identical_lines(tmp_path):
    payload = " first line \n second  line with ümlaut \n\n last line without newline".encode()
    plain = tmp_path / "f.txt"
    plain.write_bytes(payload)
    gz = _write_gz(tmp_path / "f.txt.gz", payload)
    lines = D.read_lines(plain)
    assert lines == [" first line ", " second  line with ümlaut ", "",
                     " last line without newline"]
    assert D.read_lines(gz) == lines
    assert D.read_text(gz) == payload.decode()
    assert D.open_text(gz).read() == payload.decode()
    # The real fixture too.
    fixture_gz = _write_gz(tmp_path / "ptb.train.txt.gz", PTB_TRAIN.read_bytes())
    assert D.read_lines(fixture_gz) == D.read_lines(PTB_TRAIN)
    assert len(D.read_lines(PTB_TRAIN)) == PTB_TRAIN.read_bytes().count(b"\n")


def test_crlf_is_dropped(tmp_path):
    p = tmp_path / "crlf.txt"
    p.write_bytes(b"a b\r\nc\r\n")
    assert D.read_lines(p) == ["a b", "c"]


@pytest.mark.parametrize("compressed", [False, True])
def test_non_utf8_byte_names_file_line_and_offset(tmp_path, compressed):
    payload = b" good line \n also good \n bad \xff byte \n"
    path = tmp_path / "bad.txt"
    if compressed:
        path = _write_gz(tmp_path / "bad.txt.gz", payload)
    else:
        path.write_bytes(payload)
    with pytest.raises(DataError) as exc:
        D.read_lines(path)
    msg = str(exc.value)
    offset = payload.index(b"\xff")
    assert f"{path}, line 3" in msg
    assert f"byte offset {offset}" in msg
    assert "0xff" in msg and "UTF-8" in msg


def test_truncated_gzip_names_file(tmp_path):
    payload = PTB_TRAIN.read_bytes() * 20
    whole = gzip.compress(payload)
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError) as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value)
    assert "truncated or corrupt gzip" in str(exc.value)
    with pytest.raises(DataError, match="truncated or corrupt gzip"):
        D.file_digest(path)


def test_corrupt_gzip_names_file(tmp_path):
    whole = bytearray(gzip.compress(PTB_TRAIN.read_bytes() * 20))
    whole[len(whole) // 2] ^= 0xFF  # flip one byte in the deflate stream
    path = tmp_path / "flipped.txt.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(DataError) as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value) and "corrupt gzip" in str(exc.value)


def test_not_gzip_at_all_named_gz(tmp_path):
    path = tmp_path / "plain.txt.gz"
    path.write_bytes(b"just text\n")
    with pytest.raises(DataError, match="truncated or corrupt gzip") as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value)


def test_gzip_without_gz_suffix_is_explained(tmp_path):
    path = tmp_path / "hidden.txt"
    _write_gz(path, b"text\n")
    with pytest.raises(DataError, match="gzip-compressed") as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("compressed", [False, True])
def test_empty_file(tmp_path, compressed):
    path = tmp_path / ("empty.txt.gz" if compressed else "empty.txt")
    if compressed:
        _write_gz(path, b"")
    else:
        path.write_bytes(b"")
    with pytest.raises(DataError) as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value) and "empty" in str(exc.value)


def test_missing_file_read(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(DataError) as exc:
        D.read_lines(path)
    assert str(path) in str(exc.value)
    with pytest.raises(DataError):
        D.file_digest(path)


# ---------------------------------------------------------------- checksums


def test_file_digest_is_of_decompressed_content(tmp_path):
    content = PTB_TRAIN.read_bytes()
    gz = _write_gz(tmp_path / "t.txt.gz", content)
    assert D.file_digest(PTB_TRAIN) == hashlib.sha256(content).hexdigest()
    assert D.file_digest(gz) == hashlib.sha256(content).hexdigest()
    assert D.file_digest(gz, "md5") == hashlib.md5(content).hexdigest()


def test_checksum_mismatch_rejected_with_clear_message(tmp_path):
    entry = _entry_for(PTB_TRAIN, "ptb/ptb.train.txt")
    assert D.check_file(PTB_TRAIN, entry).ok

    corrupted = tmp_path / "ptb.train.txt"
    content = bytearray(PTB_TRAIN.read_bytes())
    content[5] = ord("X")  # same size, one byte different
    corrupted.write_bytes(bytes(content))
    with pytest.raises(DataError) as exc:
        D.check_file(corrupted, entry)
    msg = str(exc.value)
    assert str(corrupted) in msg
    assert entry.sha256 in msg
    assert hashlib.sha256(bytes(content)).hexdigest() in msg
    assert "corrupt" in msg and "different version" in msg
    assert "lstmablate data fetch ptb" in msg

    # A gzip copy of the corrupted file is judged by its decompressed content.
    gz = _write_gz(tmp_path / "ptb.train.txt.gz", bytes(content))
    with pytest.raises(DataError, match="checksum mismatch"):
        D.check_file(gz, entry)
    assert D.check_file(_write_gz(tmp_path / "good.txt.gz", PTB_TRAIN.read_bytes()), entry).ok


def test_md5_used_when_sha256_unknown(tmp_path):
    entry = _entry_for(PTB_TRAIN, "squad/x.json", sha256=False)
    result = D.check_file(PTB_TRAIN, entry)
    assert result.ok and result.algo == "md5"
    other = tmp_path / "other.txt"
    other.write_text("something else\n")
    with pytest.raises(DataError, match="md5"):
        D.check_file(other, entry)


def test_successful_check_is_cached_until_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_bytes(PTB_TRAIN.read_bytes())
    entry = _entry_for(PTB_TRAIN, "ptb/ptb.train.txt")
    calls = []
    real_digest = D.file_digest  # counted where the check calls it
    monkeypatch.setattr(D.checksums, "file_digest",
                        lambda *a, **k: calls.append(a) or real_digest(*a, **k))
    D.check_file(path, entry)
    D.check_file(path, entry)
    D.check_file(path, entry)
    assert len(calls) == 1
    # A changed file (size and mtime differ) is hashed again and rejected.
    path.write_bytes(PTB_TRAIN.read_bytes() + b" extra \n")
    with pytest.raises(DataError, match="checksum mismatch"):
        D.check_file(path, entry)
    assert len(calls) == 2
    # Failures are not cached.
    with pytest.raises(DataError):
        D.check_file(path, entry)
    assert len(calls) == 3


def test_verify_reports_ok_missing_mismatch(tmp_path):
    (tmp_path / "toy").mkdir()
    good = tmp_path / "toy" / "good.txt"
    good.write_text("good\n")
    bad = tmp_path / "toy" / "bad.txt"
    bad.write_text("bad\n")
    ds = D.Dataset(
        "toy",
        (
            _entry_for(good, "toy/good.txt"),
            D.DataFile("toy/bad.txt", hashlib.sha256(b"expected\n").hexdigest(), None),
            D.DataFile("toy/missing.txt", None, "0" * 32),
        ),
        url="file://nowhere", licence="none", fetch_hint="make it",
    )
    results = {r.relpath: r for r in D.verify(tmp_path, ds)}
    assert results["toy/good.txt"].status == "ok"
    assert results["toy/bad.txt"].status == "mismatch"
    assert results["toy/bad.txt"].actual == hashlib.sha256(b"bad\n").hexdigest()
    assert str(bad) in results["toy/bad.txt"].message
    assert results["toy/missing.txt"].status == "missing"
    assert "toy/missing.txt" in results["toy/missing.txt"].message
    only = D.verify(tmp_path, ds, which=["good.txt"])
    assert [r.relpath for r in only] == ["toy/good.txt"]
    with pytest.raises(UnknownNameError):
        D.verify(tmp_path, ds, which="nonexistent.txt")


# ---------------------------------------------------------------- catalogue


def test_catalogue_lists_the_task_files():
    catalogue = available_datasets()  # declared by the tasks, not by the core
    assert {"ptb", "ud-ewt", "multi30k", "squad"} <= set(catalogue)
    rel = {name: [f.relpath for f in ds.files] for name, ds in catalogue.items()}
    assert rel["ptb"] == [f"ptb/ptb.{s}.txt" for s in ("train", "valid", "test")]
    assert rel["ud-ewt"] == [f"ud-ewt/en_ewt-ud-{s}.conllu" for s in ("train", "dev", "test")]
    assert sorted(rel["multi30k"]) == sorted(
        f"multi30k/{s}.{lang}"
        for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de"))
    squad = catalogue["squad"]
    assert squad.file("train-v1.1.json").md5 == "981b29407e0affa3b1b156f72073b945"
    assert squad.file("train-v1.1.json").checksum == ("md5", "981b29407e0affa3b1b156f72073b945")
    assert squad.file("dev-v1.1.json").md5 == "3e85deb501d4e538b6bc56f786231552"
    for name, ds in catalogue.items():
        assert ds.url and ds.licence and ds.fetch_hint
        for f in ds.files:
            if name in ("ptb", "ud-ewt", "multi30k", "squad"):  # the data this project has
                assert f.checksum is not None and f.url and f.url.startswith(("https://", "http://"))
            else:  # e.g. bwb, never downloaded here: each file says what it is; data check
                # reports it "unchecked" (tested in test_bwb_data.py)
                assert f.note and (f.url or ds.url)
            assert f.sha256 is None or len(f.sha256) == 64
            assert f.md5 is None or len(f.md5) == 32
    with pytest.raises(UnknownNameError, match="Did you mean 'ptb'"):
        D.get_dataset("ptbb")


# ---------------------------------------------------------------- fetch


def test_fetch_from_file_urls_verifies_and_writes_atomically(tmp_path):
    src = tmp_path / "remote"
    src.mkdir()
    (src / "a.txt").write_bytes(PTB_TRAIN.read_bytes())
    _write_gz(src / "b.txt.gz", b" b content \n")
    (tmp_path / "plain_b").write_bytes(b" b content \n")
    ds = D.Dataset(
        "toy",
        (
            _entry_for(PTB_TRAIN, "toy/a.txt", url=(src / "a.txt").as_uri()),
            _entry_for(tmp_path / "plain_b", "toy/b.txt", url=(src / "b.txt.gz").as_uri(),
                       url_gzipped=True),
        ),
        url="file://", licence="none", fetch_hint="copy it",
    )
    dest = tmp_path / "data"
    paths = D.fetch(ds, dest, log=None)
    assert paths == [dest / "toy" / "a.txt", dest / "toy" / "b.txt.gz"]
    assert (dest / "toy" / "a.txt").read_bytes() == PTB_TRAIN.read_bytes()
    assert D.read_lines(D.find_file(dest, "toy/b.txt")) == [" b content "]
    assert all(r.ok for r in D.verify(dest, ds))
    # No temporary files are left behind.
    assert sorted(p.name for p in (dest / "toy").iterdir()) == ["a.txt", "b.txt.gz"]

    # Present and verified: nothing is downloaded again.
    def no_network(url):
        raise AssertionError(f"unexpected download of {url}")
    assert D.fetch(ds, dest, opener=no_network, log=None) == paths


def test_fetch_rejects_a_bad_download_and_leaves_nothing(tmp_path):
    src = tmp_path / "remote.txt"
    src.write_text("not what the catalogue says\n")
    ds = D.Dataset("toy", (D.DataFile("toy/x.txt", "0" * 64, None, url=src.as_uri()),),
                   url="file://", licence="none", fetch_hint="copy it")
    dest = tmp_path / "data"
    with pytest.raises(DataError) as exc:
        D.fetch(ds, dest, log=None)
    assert src.as_uri() in str(exc.value) and "0" * 64 in str(exc.value)
    assert list((dest / "toy").iterdir()) == []

    missing = D.Dataset("toy", (D.DataFile("toy/y.txt", "0" * 64, None,
                                           url=(tmp_path / "absent").as_uri()),),
                        url="file://", licence="none", fetch_hint="copy it")
    with pytest.raises(DataError, match="could not download"):
        D.fetch(missing, dest, log=None)
    assert list((dest / "toy").iterdir()) == []


# ---------------------------------------------------------------- real data


@pytest.mark.parametrize("name", ["ptb", "ud-ewt", "multi30k"])
def test_real_data_checksums_verify(name):
    base = real_data_dir()
    ds = available_datasets()[name]
    if not (base / ds.files[0].relpath).exists() and not (
            base / (ds.files[0].relpath + ".gz")).exists():
        pytest.skip(f"real {name} data is not in ${D.ENV_VAR} ({base})")
    results = D.verify(base, ds)
    assert [r.status for r in results] == ["ok"] * len(ds.files), [r.message for r in results]


def test_real_squad_dev_verifies():
    base = real_data_dir()
    try:
        D.find_file(base, "squad/dev-v1.1.json")
    except DataError:
        pytest.skip(f"SQuAD dev file not found under {base}")
    (result,) = D.verify(base, available_datasets()["squad"], which="dev-v1.1.json")
    assert result.ok and result.algo == "sha256"
    assert D.file_digest(result.path, "md5") == "3e85deb501d4e538b6bc56f786231552"
