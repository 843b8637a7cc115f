"""The GRU's kernels (``lstmablate/cells/gru.py``): the family (``family.py``), its
recurrence in PyTorch loops (``recurrent.py``), its Triton kernels (``triton_kernels.py``)
and its C loops (``gru.c``)."""
