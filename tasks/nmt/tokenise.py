"""Moses tokenisation as the recipe ran it, and detokenisation for sacreBLEU.

OpenNMT-py's Multi30k recipe (``docs/source/extended.md`` at 18d3d2e1, step 3):
``perl tools/tokenizer.perl -a -no-escape -l {en,de} -q``
— ``-a`` splits hyphens inside words aggressively (``port-a-potty`` -> ``port @-@ a @-@
potty``), ``-no-escape`` leaves ``& < > ' " [ ]`` as they are (no ``&amp;``/``&apos;``
entities). :mod:`sacremoses` is the Python port of that script; ``aggressive_dash_splits=True,
escape=False`` are the two flags. The ``-lower`` of the recipe's preprocess step did nothing in
that OpenNMT-py version, so text stays cased.

Detokenisation (for the sacreBLEU column, which scores detokenised text against the raw
reference) is sacremoses' port of ``detokenizer.perl``, which also joins ``@-@`` back.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from sacremoses import MosesDetokenizer, MosesTokenizer

__all__ = ["SETTINGS", "tokenise", "tokenise_lines", "detokenise"]

#: what the artefacts record about the tokenisation (a run is evaluated with the same)
SETTINGS = {"tool": "sacremoses", "aggressive_dash_splits": True, "escape": False,
            "equivalent": "tokenizer.perl -a -no-escape -l LANG -q"}


@lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=None)
def _detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang=lang)


def tokenise(line: str, lang: str) -> list[str]:
    """The Moses tokens of one raw line (``-a -no-escape``); an empty line gives []."""
    if not line.strip():
        return []
    return _tokenizer(lang).tokenize(line, aggressive_dash_splits=True, escape=False)


def tokenise_lines(lines: Iterable[str], lang: str) -> list[list[str]]:
    return [tokenise(line, lang) for line in lines]


def detokenise(tokens: list[str], lang: str) -> str:
    """The Moses detokenisation of ``tokens`` (``@-@`` joined, spacing of punctuation undone)."""
    if not tokens:
        return ""
    return _detokenizer(lang).detokenize(tokens)
