"""DrQA's manual token features of a context given its question (PROTOCOLS.md §3.1).

For every context token (hitvoice/DrQA prepro.py, facebookresearch/DrQA reader vectorize):

* ``em_cased``: the token's text occurs among the question's tokens;
* ``em_uncased``: its lower-cased text occurs among the lower-cased question tokens;
* ``em_lemma``: its lemma occurs among the question lemmas — **not available here**: it needs
  a lemmatizer (spaCy's ``en_core_web_*`` model or CoreNLP), which this toolkit does not
  install; likewise the POS and NER one-hots.  The features a run used are listed in its
  artefacts (``features``) and in every table;
* ``tf``: normalised term frequency, the count of the lower-cased token in its context
  divided by the context length.
"""

from __future__ import annotations

from collections import Counter

import torch

FEATURES = ("em_cased", "em_uncased", "tf")
#: DrQA features that need a tagger/lemmatizer model this toolkit does not ship
UNAVAILABLE = {"em_lemma": "needs a lemmatizer (spaCy model or CoreNLP)",
               "pos": "needs a POS tagger (spaCy model or CoreNLP)",
               "ner": "needs an NER model (spaCy model or CoreNLP)"}


def token_features(context_words: list[str], question_words: list[str],
                   names: tuple[str, ...] = FEATURES) -> torch.Tensor:
    """(len(context), len(names)) float tensor of the features ``names``."""
    q_cased = set(question_words)
    q_lower = {w.lower() for w in question_words}
    lower = [w.lower() for w in context_words]
    counts = Counter(lower)
    n = max(len(context_words), 1)
    columns = {
        "em_cased": [float(w in q_cased) for w in context_words],
        "em_uncased": [float(w in q_lower) for w in lower],
        "tf": [counts[w] / n for w in lower],
    }
    if not names:
        return torch.zeros(len(context_words), 0)
    return torch.tensor([columns[k] for k in names]).t().reshape(len(context_words), len(names))
