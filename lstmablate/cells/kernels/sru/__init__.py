"""The fast paths of the 2018 SRU (``lstmablate/cells/sru.py``, ``sru``), whose forget gate
reads c_{t-1} element-wise (v_f ∘ c_{t-1}): the family (``family.py``), the memory's pass over
time and its reverse pass in C and in PyTorch loops (``loops.py``, ``sru.c``) and on Triton
(``triton_kernels.py``)."""
