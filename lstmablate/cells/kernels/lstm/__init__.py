"""The LSTM family's kernels (``lstmablate/cells/lstm.py``): the family (``family.py``),
its recurrence and scan in PyTorch loops (``recurrent.py``, ``scan.py``), its Triton
kernels (``triton_kernels.py``) and its C loops (``lstm_family.c``)."""
