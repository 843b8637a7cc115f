"""Multi30k task 1 (WMT16 multimodal translation, En->De): the files and how the recipe read them.

Files (raw, untokenised; ``.gz`` accepted) under the data directory, as distributed by the
multi30k/dataset repository (data/task1/raw): ``multi30k/{train,val,test_2016_flickr}.{en,de}``,
29,000 / 1,014 / 1,000 line-aligned sentence pairs. Checksums are in :data:`MULTI30K`.

OpenNMT-py's Multi30k recipe (docs/source/extended.md at 18d3d2e1):

1. *Delete the last line of every non-test file* (``sed -i "$ d"``): :func:`read_split` with
   ``drop_last_line`` removes the last line of the train and val files exactly as ``sed`` does
   — whatever that line holds. The WMT16 tarballs the recipe downloaded may have ended in an
   empty line (then ``sed`` removed only that); the multi30k/dataset files do not, so on them
   the rule removes one real pair from each of train and val (28,999 and 1,013 pairs remain).
   ``data.drop_last_line: false`` keeps every pair.
2. Tokenise with Moses (:mod:`.tokenise`).
3. ``preprocess.py`` keeps a train or valid pair only if ``0 < len(src) <= 50`` and
   ``0 < len(tgt) <= 50`` tokens (``src_seq_length`` / ``tgt_seq_length``, TextDataset's
   ``filter_pred``): :func:`keep_pair`. The test file is never preprocessed: ``translate.py``
   translates every line of it.
"""

from __future__ import annotations

from pathlib import Path

from lstmablate.data import DataFile, Dataset, check_file, find_file, read_lines
from lstmablate.errors import DataError

__all__ = ["MULTI30K", "SPLIT_FILES", "LANGS", "relpath", "read_split", "keep_pair"]

_RAW = ("https://raw.githubusercontent.com/multi30k/dataset/"
        "c9be912dc05a3ebf9ae5bb5f7f58c1791cda43ab/data/task1/raw/")


def _file(name: str, sha256: str, md5: str, size: int) -> DataFile:
    return DataFile(f"multi30k/{name}", sha256, md5, _RAW + name + ".gz", url_gzipped=True,
                    size=size)


MULTI30K = Dataset(
    name="multi30k",
    files=(
        _file("train.en", "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
              "053a34ece7c904dbc8c7361799afbe4c", 1_801_238),
        _file("train.de", "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
              "d3b4bc1671cfb805267f97f16884beba", 2_110_398),
        _file("val.en", "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
              "2234730e7925354b766681b029b347ec", 63_297),
        _file("val.de", "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
              "9f139b15d9d11936dea7af2904e57d8c", 75_981),
        _file("test_2016_flickr.en",
              "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
              "2022a6c31e2418047a0511333d55ed42", 62_076),
        _file("test_2016_flickr.de",
              "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
              "cde61d7401b116652ee84099c7858ca3", 70_649),
    ),
    url="https://github.com/multi30k/dataset/tree/master/data/task1/raw",
    licence=("No licence file in the multi30k/dataset repository; captions of Flickr30k "
             "images (research use; cite Elliott et al. 2016)."),
    fetch_hint=("or download data/task1/raw/{train,val,test_2016_flickr}.{en,de}.gz "
                "from the multi30k/dataset repository into <data-dir>/multi30k/ "
                "(they may stay gzip-compressed)"),
)

#: split name -> file stem (the test split is the 2016 Flickr test set, as in the recipe)
SPLIT_FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}
#: the languages of task 1
LANGS = ("en", "de")


def relpath(split: str, lang: str) -> str:
    return f"multi30k/{SPLIT_FILES[split]}.{lang}"


def read_split(data_dir: Path, split: str, src_lang: str, tgt_lang: str, *,
               drop_last_line: bool, verify: bool = True) -> tuple[list[str], list[str]]:
    """The raw source and target lines of ``split`` (line-aligned), after the recipe's
    last-line rule (train and val only; see the module docstring).

    ``verify`` compares each file with its catalogued checksum (a DataError names a file
    that differs). Files of different lengths are a DataError naming both."""
    paths, lines = [], []
    for lang in (src_lang, tgt_lang):
        rel = relpath(split, lang)
        path = find_file(data_dir, rel)
        if verify:
            check_file(path, MULTI30K.file(rel))
        paths.append(path)
        lines.append(read_lines(path))
    src, tgt = lines
    if len(src) != len(tgt):
        raise DataError(
            f"{paths[0]} has {len(src)} lines but {paths[1]} has {len(tgt)}; the two sides of "
            f"a parallel corpus must be line-aligned (one sentence pair per line number).")
    if drop_last_line and split != "test" and src:
        src, tgt = src[:-1], tgt[:-1]  # sed -i "$ d" on every non-test file
    return src, tgt


def keep_pair(src_tokens: list[str], tgt_tokens: list[str], max_length: int) -> bool:
    """preprocess.py's filter: ``0 < len(src) <= max_length and 0 < len(tgt) <= max_length``."""
    return 0 < len(src_tokens) <= max_length and 0 < len(tgt_tokens) <= max_length
