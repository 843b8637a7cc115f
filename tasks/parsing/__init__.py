"""Dependency parsing (UD English EWT) with Dozat & Manning's deep biaffine parser, Parser-v1's
protocol: the ``parsing`` task plugin (:mod:`.task`) and its parts (conllu, vocab, buckets,
model, decode, metrics, data) and its ``lstmablate data validate-conllu`` command
(:mod:`.commands`)."""
