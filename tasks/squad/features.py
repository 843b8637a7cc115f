"""DrQA's manual token features of a context given its question (hitvoice/DrQA ``prepro.py:
annotate``, facebookresearch/DrQA ``reader/vector.py``), in the order hitvoice builds them:

* ``em_cased``: the token's text occurs among the question's tokens;
* ``em_uncased``: its lower-cased text occurs among the lower-cased question tokens;
* ``em_lemma``: its lemma occurs among the question's lemmas (a lemma of ``-PRON-``, spaCy 2's
  pronoun lemma, counts as the lower-cased text, as hitvoice writes it);
* ``tf``: normalised term frequency, the count of the lower-cased token in its context
  divided by the context length;
* ``pos``: a one-hot vector of the token's fine-grained part-of-speech tag (spaCy ``tag_``);
* ``ner``: a one-hot vector of its entity type (spaCy ``ent_type_``, "" outside entities).

``em_lemma``, ``pos`` and ``ner`` need the tokens of a spaCy pipeline with a tagger and an
entity recogniser (``data.tagger``, e.g. ``en_core_web_md``, hitvoice/DrQA's since 2022: its
February-2018 code used spaCy 1.x's ``en``, docs/squad.md); the one-hot
sizes are the tags and entity types seen when the vocabulary was built (kept with the run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from .tokenizer import Token

FEATURES = ("em_cased", "em_uncased", "em_lemma", "tf", "pos", "ner")
#: the features that need a spaCy pipeline with a tagger and NER (data.tagger)
TAGGER_FEATURES = ("em_lemma", "pos", "ner")
#: what runs without a tagger compute
BASIC_FEATURES = ("em_cased", "em_uncased", "tf")


def lemma(t: Token) -> str:
    return t.text.lower() if t.lemma == "-PRON-" else t.lemma


def feature_size(names: Sequence[str], pos_tags: Sequence[str] = (),
                 ner_tags: Sequence[str] = ()) -> int:
    """The number of feature columns: one per scalar feature, one per tag for the one-hots."""
    return sum(len(pos_tags) if n == "pos" else len(ner_tags) if n == "ner" else 1 for n in names)


def token_features(context: Sequence[Token], question: Sequence[Token],
                   names: Sequence[str] = BASIC_FEATURES, pos_tags: Sequence[str] = (),
                   ner_tags: Sequence[str] = ()) -> torch.Tensor:
    """(len(context), feature_size) float tensor of the features ``names``, in that order; a
    tag not among ``pos_tags`` / ``ner_tags`` has an all-zero one-hot."""
    words = [t.text for t in context]
    lower = [w.lower() for w in words]
    q_cased = {t.text for t in question}
    q_lower = {t.text.lower() for t in question}
    n = max(len(words), 1)
    columns: list[torch.Tensor] = []
    for name in names:
        if name == "em_cased":
            columns.append(torch.tensor([float(w in q_cased) for w in words]).unsqueeze(1))
        elif name == "em_uncased":
            columns.append(torch.tensor([float(w in q_lower) for w in lower]).unsqueeze(1))
        elif name == "em_lemma":
            q_lemma = {lemma(t) for t in question}
            columns.append(torch.tensor([float(lemma(t) in q_lemma) for t in context]).unsqueeze(1))
        elif name == "tf":
            counts = Counter(lower)
            columns.append(torch.tensor([counts[w] / n for w in lower]).unsqueeze(1))
        elif name in ("pos", "ner"):
            tags = pos_tags if name == "pos" else ner_tags
            index = {t: i for i, t in enumerate(tags)}
            onehot = torch.zeros(len(context), len(tags))
            for i, t in enumerate(context):
                k = index.get(t.tag if name == "pos" else t.ent)
                if k is not None:
                    onehot[i, k] = 1.0
            columns.append(onehot)
        else:
            raise ValueError(f"unknown DrQA feature {name!r}; the features are {FEATURES}")
    if not columns:
        return torch.zeros(len(context), 0)
    return torch.cat([c.reshape(len(context), -1) for c in columns], dim=1)
