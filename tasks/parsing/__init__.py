"""Dependency parsing (UD English EWT): the CoNLL-U reader; the parser task comes later."""
