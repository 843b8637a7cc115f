"""Tokenised SQuAD examples: paragraphs and questions with character offsets, answers located
on tokens.

Each paragraph is tokenised once (:class:`TokenizedParagraph`); each question keeps its gold
answer texts (what the scorer compares, all of them) and the token spans of the answers whose
characters fall exactly on token boundaries (:func:`~.tokenizer.char_span_to_tokens`, DrQA's
rule).  The training target is chosen among those spans by the reader:

* ``first``: the first answer that lies on token boundaries (DrQA's ``single_answer``; the
  official training file has one answer per question);
* ``most_common``: the span given by most annotators, ties to the first (AllenNLP's
  ``Counter.most_common(1)`` in its reading-comprehension utilities, PROTOCOLS.md §2.1).

A training question none of whose answers lies on token boundaries (DrQA drops these; 1 of
10,570 in the dev file with this tokenizer) has no target and is left out of training; it is
always evaluated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .data import Article
from .tokenizer import Token, Tokenizer, char_span_to_tokens, span_text

TARGET_RULES = ("first", "most_common")


@dataclass
class TokenizedParagraph:
    context: str
    tokens: list[Token]

    @property
    def words(self) -> list[str]:
        return [t.text for t in self.tokens]

    def span_text(self, first: int, last: int) -> str:
        """The exact original characters of tokens ``first..last``: a prediction's answer."""
        return span_text(self.context, self.tokens, first, last)


@dataclass
class TokenizedQuestion:
    qid: str
    paragraph: int  # index into SquadExamples.paragraphs
    tokens: list[Token]
    gold: tuple[str, ...]  # every gold answer text (the scorer's ground truths)
    spans: list[tuple[int, int]] = field(default_factory=list)  # token spans of aligned answers
    target: tuple[int, int] | None = None  # the training target, None: not trainable

    @property
    def words(self) -> list[str]:
        return [t.text for t in self.tokens]


@dataclass
class SquadExamples:
    paragraphs: list[TokenizedParagraph]
    questions: list[TokenizedQuestion]

    def gold(self) -> list[tuple[str, tuple[str, ...]]]:
        """(question id, gold answer texts) of every question, for the scorer."""
        return [(q.qid, q.gold) for q in self.questions]

    @property
    def n_trainable(self) -> int:
        return sum(q.target is not None for q in self.questions)


def choose_target(spans: list[tuple[int, int]], rule: str) -> tuple[int, int] | None:
    if not spans:
        return None
    if rule == "first":
        return spans[0]
    if rule == "most_common":
        return Counter(spans).most_common(1)[0][0]  # ties: the first seen (Counter keeps order)
    raise ValueError(f"unknown answer target rule {rule!r}; use one of {TARGET_RULES}")


def tokenize_articles(articles: list[Article], tokenizer: Tokenizer,
                      target_rule: str = "first") -> SquadExamples:
    paragraphs: list[TokenizedParagraph] = []
    questions: list[TokenizedQuestion] = []
    for art in articles:
        for par in art.paragraphs:
            tp = TokenizedParagraph(par.context, tokenizer.tokenize(par.context))
            paragraphs.append(tp)
            for q in par.questions:
                spans = [s for s in (char_span_to_tokens(tp.tokens, a.start, a.end)
                                     for a in q.answers) if s is not None]
                questions.append(TokenizedQuestion(
                    q.qid, len(paragraphs) - 1, tokenizer.tokenize(q.question),
                    tuple(a.text for a in q.answers), spans, choose_target(spans, target_rule)))
    return SquadExamples(paragraphs, questions)
