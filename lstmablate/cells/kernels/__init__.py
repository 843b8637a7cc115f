"""The cells' fast sequence kernels ("fast paths"), by concern.

Every cell keeps its plain reference implementation (``Cell.forward``: one ``step`` per
time step, autograd through every operation).  A cell with a fast path declares its kernel
module (``fast_kernels = FastKernels("lstmablate.cells.kernels.<module>", ...)``, see
``lstmablate/cells/base.py``); the module is imported, and its native library built, only
when such a cell first runs.  ``tests/test_fused.py`` and ``tests/test_fused_multiplicative.py``
compare every fast path with the reference loop.

Which kernel a call takes
    ``dispatch.py``     the rules every family shares (forced reference loop, autocast,
                        masks with holes, dtypes; PyTorch's kernel or ours on CPU)
    ``calibrate.py``    our native kernel or PyTorch's own, by a short timing on first use
                        per machine and shape class, cached on disk
    ``switches.py``     ``reference_mode()``, ``LSTMABLATE_REFERENCE``, ``LSTMABLATE_NATIVE``,
                        ``LSTMABLATE_PACKED_GEMM``, ``LSTMABLATE_TORCH_ON_CPU``

The kernels, one module per family (each has ``plan``, ``forward``, ``available``,
``kernel_name``)
    ``lstm_family.py``  the LSTM ablations: PyTorch's LSTM/RNN, or ``lstm_recurrent.py``
                        (the recurrence with a hand-written BPTT) / ``lstm_scan.py``
                        (nothing reads h_{t-1})
    ``gru.py``          the GRU
    ``factored.py``     mRNN, mLSTM;  ``multi_matrix.py``: mmRNN, mmLSTM;  ``dyck.py``:
                        the Dyck-RNN; shared by them: ``second_order.py``,
                        ``step_products.py`` (packed per-step products)
    ``delegate.py``     calls of PyTorch's fused LSTM / RNN / GRU (cuDNN, oneDNN)
    ``sequences.py``    masks, input products, final states, outputs at padding

The native (C) kernels
    ``csrc/``           the C sources (package data): ``la_blas.[ch]``, ``la_real.h``, and
                        ``lstm_family.c``, ``gru.c``, ``second_order.c``
    ``native_build.py`` compiling one library per family (compiler, flags, cache key,
                        private cache directory, remembered failures)
    ``native.py``       loading it: signatures read from the C sources, checked calls, the
                        BLAS PyTorch uses, a self-test on load

This package's ``__init__`` imports nothing, so importing any one module pulls in only
what that module needs.
"""
