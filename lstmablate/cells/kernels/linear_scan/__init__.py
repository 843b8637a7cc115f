"""The linear scan's kernels, shared by every cell whose gates read the inputs only
(``lstmablate/cells/_elementwise.py``: ``qrnn``, ``sru-2017``, ``mingru``, ``minlstm``): the
family (``family.py``), the memory's pass over time and its reverse pass in C and in PyTorch
loops (``loops.py``, ``linear_scan.c``) and on Triton (``triton_kernels.py``)."""
