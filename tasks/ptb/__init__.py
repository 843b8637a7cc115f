"""Penn Treebank language modelling (Zaremba et al. 2014, TensorFlow PTB tutorial protocol).

Word level (Mikolov's 10k-word LM version, perplexity) and character level
(Mikolov's ``ptb.char.*`` derivation, bits per character). The data side lives
in :mod:`lstmablate_tasks.ptb.data`.
"""
