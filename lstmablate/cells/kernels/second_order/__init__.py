"""The second-order cells' kernels (``lstmablate/cells/multiplicative.py``,
``lstmablate/cells/dyck.py``): three families (``factored.py``, ``multi_matrix.py``,
``dyck.py``) on what they share (``shared.py``, ``step_products.py``), their Triton kernels
(``triton_kernels.py``) and their C loops (``second_order.c``, one library for mRNN, mLSTM,
mmRNN and mmLSTM)."""
