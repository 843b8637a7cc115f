"""Tokenised SQuAD examples: paragraphs and questions with character offsets, answers located
on tokens.

Each paragraph is tokenised once (:class:`TokenizedParagraph`); each question keeps its gold
answer texts (what the scorer compares, all of them) and the token spans of the answers whose
characters fall exactly on token boundaries (:func:`~.tokenizer.char_span_to_tokens`, DrQA's
rule).  The training target is chosen among those spans by the reader:

* ``first``: the first answer that lies on token boundaries (DrQA's ``single_answer``; the
  official training file has one answer per question);
* ``most_common``: the span given by most annotators, ties to the first (AllenNLP's
  ``Counter.most_common(1)`` in its reading-comprehension utilities).

How an answer becomes a token span (``span_rule``):

* ``exact``: only answers whose characters are exactly a token span count (DrQA's rule,
  hitvoice ``prepro.py: index_answer``); a training question none of whose answers lies on
  token boundaries has no target and is left out of training (it is always evaluated);
* ``allennlp``: every answer gives a span, the tokens AllenNLP's
  ``char_span_to_token_span`` finds for it, which covers an answer that cuts a token
  (:func:`~.tokenizer.allennlp_token_span`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .data import Article
from .tokenizer import Token, allennlp_token_span, char_span_to_tokens, span_text

TARGET_RULES = ("first", "most_common")
SPAN_RULES = {"exact": char_span_to_tokens, "allennlp": allennlp_token_span}


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


def tokenize_articles(articles: list[Article], tokenizer: Any, target_rule: str = "first",
                      span_rule: str = "exact") -> SquadExamples:
    """Every paragraph and question tokenised by ``tokenizer`` (``tokenize(text)`` ->
    tokens), answers located by ``span_rule``, the training target chosen by ``target_rule``."""
    to_span = SPAN_RULES[span_rule]
    paragraphs: list[TokenizedParagraph] = []
    questions: list[TokenizedQuestion] = []
    for art in articles:
        for par in art.paragraphs:
            tp = TokenizedParagraph(par.context, tokenizer.tokenize(par.context))
            paragraphs.append(tp)
            for q in par.questions:
                spans = [s for s in (to_span(tp.tokens, a.start, a.end)
                                     for a in q.answers) if s is not None]
                questions.append(TokenizedQuestion(
                    q.qid, len(paragraphs) - 1, tokenizer.tokenize(q.question),
                    tuple(a.text for a in q.answers), spans, choose_target(spans, target_rule)))
    return SquadExamples(paragraphs, questions)
