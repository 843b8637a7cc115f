"""A rule-based English tokenizer that keeps character offsets.

Every token is ``(text, start, end)`` with ``text == source[start:end]``, so a predicted
span of tokens ``i..j`` maps back to the exact original characters
``source[tokens[i].start:tokens[j].end]`` (what the SQuAD scorer compares).

The rules follow DrQA's ``RegexpTokenizer`` (facebookresearch/DrQA,
drqa/tokenizers/regexp_tokenizer.py; "emulates the Stanford/NLTK PTB tokenizers", one of the
tokenizers DrQA's reader preprocessing offers besides CoreNLP and spaCy).  At each position
the first of these patterns that matches is taken:

 1. numbers: digit runs joined by ``:`` ``.`` ``,`` (``3.5``, ``1,000``, ``12:30``);
 2. titles: ``Dr. Mr. Mrs. Prof. St.`` ... followed by a space keep their period;
 3. abbreviations: two or more letter-period pairs before a space or the end (``U.S.``);
 4. negations: ``don't`` -> ``do`` ``n't``;
 5. hyphenated words: ``state-of-the-art`` is one token — **changed here** (option
    ``split_hyphens``, default on): hyphens between letters are split off, as spaCy's English
    infix rules do, because SQuAD answers often end inside such words ("Denver" in
    "Denver-based"), and a span must start and end on token boundaries;
 6. ``cannot`` -> ``can`` ``not``;
 7. alphanumeric runs (letters, digits, combining marks);
 8. clitics ``'s 't 'd 'm 're 'll 've``;
 9. dashes ``--`` and the en/em dashes, the ellipsis ``...`` / ``…``;
10. any other punctuation character, then any other non-space character, one at a time.

DrQA's optional quote/dash normalisation (``"`` -> ````` etc.) is not applied: tokens are
always the original characters.  Matching is case-insensitive (titles, ``n't``).
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

_ALNUM = r"[\p{L}\p{N}\p{M}]"
_PATTERNS = (
    ("number", r"\p{Nd}+(?:[:.,]\p{Nd}+)*"),
    ("title", r"(?:dr|esq|hon|jr|mr|mrs|ms|prof|rev|sr|st|rt|messrs|mmes|msgr)\.(?=\p{Z}|\s)"),
    ("abbreviation", r"(?:\p{L}\.){2,}(?=\p{Z}|\s|$)"),
    ("negation", rf"(?:(?!n't){_ALNUM})++(?=n't)|n't"),
    ("hyphenated", rf"{_ALNUM}++(?:[-\u058A\u2010\u2011]{_ALNUM}++)+"),
    ("cannot", r"can(?=not\b)"),
    ("alnum", rf"{_ALNUM}++"),
    ("clitic", r"'(?:[tsdm]|re|ll|ve)\b"),
    ("dash", r"--|[\u2013\u2014\u2015]"),
    ("ellipsis", r"\.\.\.|\u2026"),
    ("punct", r"\p{P}"),
    ("other", r"[^\p{Z}\p{C}\s]"),
)


@dataclass(frozen=True)
class Token:
    text: str
    start: int  # character offsets into the source string; text == source[start:end]
    end: int


class Tokenizer:
    """``tokenize(text) -> list[Token]`` (see the module docstring for the rules)."""

    def __init__(self, split_hyphens: bool = True):
        self.split_hyphens = split_hyphens
        pats = [(n, p) for n, p in _PATTERNS if not (split_hyphens and n == "hyphenated")]
        self._re = regex.compile("|".join(f"(?P<{n}>{p})" for n, p in pats),
                                 flags=regex.IGNORECASE | regex.UNICODE | regex.V0)

    def tokenize(self, text: str) -> list[Token]:
        return [Token(m.group(), m.start(), m.end()) for m in self._re.finditer(text)]

    def __repr__(self) -> str:
        return f"Tokenizer(split_hyphens={self.split_hyphens})"


def span_text(source: str, tokens: list[Token], first: int, last: int) -> str:
    """The original characters covered by tokens ``first..last`` (inclusive)."""
    return source[tokens[first].start:tokens[last].end]


def char_span_to_tokens(tokens: list[Token], start: int, end: int) -> tuple[int, int] | None:
    """The token span whose characters are exactly ``[start, end)``, or None.

    This is how DrQA finds an answer's tokens for training: the token starting at the
    answer's first character and the token ending at its last (no partial tokens).
    """
    first = next((i for i, t in enumerate(tokens) if t.start == start), None)
    last = next((i for i, t in enumerate(tokens) if t.end == end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def covering_tokens(tokens: list[Token], start: int, end: int) -> tuple[int, int] | None:
    """The smallest token span that covers the characters ``[start, end)`` (None if no token
    overlaps them)."""
    inside = [i for i, t in enumerate(tokens) if t.end > start and t.start < end]
    return (inside[0], inside[-1]) if inside else None
