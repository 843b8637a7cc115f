"""Tokenizers that keep character offsets: spaCy's rule-based English tokenizer (the
originals'), and a built-in regular-expression one.

Every token is ``(text, start, end)`` with ``text == source[start:end]``, so a predicted
span of tokens ``i..j`` maps back to the exact original characters
``source[tokens[i].start:tokens[j].end]`` (what the SQuAD scorer compares).

**spaCy** (``data.tokenizer: spacy``, :class:`SpacyTokenizer`): hitvoice/DrQA
(``prepro.py``) and AllenNLP's BiDAF (``WordTokenizer`` -> ``SpacyWordSplitter``) both
tokenised with spaCy's English tokenizer, which needs no trained model
(``spacy.blank("en")``; a pipeline such as ``en_core_web_md`` tokenises with the same
rules).  spaCy is imported only when this tokenizer is built, so everything else works
without it.  As the originals: DrQA replaces every whitespace character by a space before
tokenising (``clean_spaces``, the offsets unchanged) and keeps the tokens spaCy makes of
extra whitespace; AllenNLP drops them (``is_space``).  With a pipeline that has a tagger
and an entity recogniser, each token also carries its lemma, fine-grained tag and entity
type (DrQA's features, :mod:`.features`).

**Regular expressions** (``data.tokenizer: regex``, :class:`Tokenizer`): the rules follow
DrQA's ``RegexpTokenizer`` (facebookresearch/DrQA,
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
from typing import Any

import regex

from lstmablate.errors import ConfigError, UserError

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
    # from a spaCy pipeline with a tagger and NER (else ""): lemma, fine-grained tag, entity type
    lemma: str = ""
    tag: str = ""
    ent: str = ""


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


TOKENIZERS = ("spacy", "regex")
_WHITESPACE = regex.compile(r"\s")


def load_spacy(pipeline: str = "") -> Any:
    """``spacy.blank("en")``, or the installed pipeline ``pipeline`` (a package name such as
    ``en_core_web_md`` or a directory), with a clear error when spaCy or the pipeline is
    missing."""
    try:
        import spacy
    except ImportError:
        raise UserError(
            "data.tokenizer=spacy: spaCy is not installed. The SQuAD readers tokenise with "
            "spaCy's rule-based English tokenizer, as hitvoice/DrQA and AllenNLP did (no model "
            "needed): `pip install spacy` (`make install` installs it). Or use the built-in "
            "regular-expression tokenizer, which is not the originals': --set "
            "data.tokenizer=regex (the report marks such runs).") from None
    if not pipeline:
        return spacy.blank("en")
    try:
        return spacy.load(pipeline)
    except OSError as e:
        raise UserError(
            f"data.tagger={pipeline!r}: spaCy cannot load this pipeline ({str(e).splitlines()[0]}). "
            f"Install it (`python -m spacy download {pipeline}` for a spaCy model), or leave "
            "DrQA's tagger features out: --set data.tagger= --set "
            "model.features=[em_cased,em_uncased,tf] (the report marks such runs).") from None


class SpacyTokenizer:
    """spaCy's rule-based English tokenizer, or a whole spaCy pipeline (``nlp``: then every
    token carries its lemma, tag and entity type).  ``clean_spaces``: tokenise the text with
    every whitespace character replaced by a space (hitvoice/DrQA's ``clean_spaces``; the
    offsets do not change); ``keep_space``: keep spaCy's tokens of extra whitespace (DrQA)
    rather than dropping them (AllenNLP)."""

    def __init__(self, nlp: Any = None, *, clean_spaces: bool = True, keep_space: bool = True):
        self.nlp = nlp if nlp is not None else load_spacy()
        self.clean_spaces, self.keep_space = clean_spaces, keep_space
        names = set(getattr(self.nlp, "pipe_names", ()))
        self.annotates = bool(names)  # a pipeline with components: run it (tags, entities)

    def tokenize(self, text: str) -> list[Token]:
        src = _WHITESPACE.sub(" ", text) if self.clean_spaces else text
        doc = self.nlp(src) if self.annotates else self.nlp.make_doc(src)
        out = []
        for w in doc:
            if w.is_space and not self.keep_space:
                continue
            start, end = w.idx, w.idx + len(w.text)
            if self.annotates:
                out.append(Token(text[start:end], start, end, w.lemma_, w.tag_, w.ent_type_))
            else:
                out.append(Token(text[start:end], start, end))
        return out

    def __repr__(self) -> str:
        name = (f"{self.nlp.meta.get('lang', '')}_{self.nlp.meta.get('name', '')}"
                if self.annotates else "spacy.blank('en')")
        return f"SpacyTokenizer({name}, clean_spaces={self.clean_spaces}, keep_space={self.keep_space})"


def make_tokenizer(name: str, *, split_hyphens: bool = True, pipeline: str = "",
                   clean_spaces: bool = True, keep_space: bool = True) -> Tokenizer | SpacyTokenizer:
    """The tokenizer ``data.tokenizer`` names (``pipeline``: ``data.tagger``, spaCy only)."""
    if name == "regex":
        if pipeline:
            raise ConfigError("data.tagger needs data.tokenizer=spacy (the tagger's tokens are "
                              "spaCy's)")
        return Tokenizer(split_hyphens=split_hyphens)
    if name == "spacy":
        return SpacyTokenizer(load_spacy(pipeline), clean_spaces=clean_spaces,
                              keep_space=keep_space)
    raise ConfigError(f"data.tokenizer must be one of {', '.join(TOKENIZERS)}, got {name!r}")


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


def allennlp_token_span(tokens: list[Token], start: int, end: int) -> tuple[int, int] | None:
    """The token span AllenNLP trains on for the characters ``[start, end)``, exact or not
    (``reading_comprehension/util.py: char_span_to_token_span``): the first token starting
    at or after ``start``, one back if it starts after it; then from there the first token
    ending at or after ``end`` (the last token when none does).  A span cutting a token
    ("gold" of "golden") keeps the whole token.  None only when there are no tokens."""
    if not tokens:
        return None
    first = 0
    while first < len(tokens) and tokens[first].start < start:
        first += 1
    if first == len(tokens) or tokens[first].start > start:
        first = max(first - 1, 0)
    last = first
    while last < len(tokens) - 1 and tokens[last].end < end:
        last += 1
    return first, last
