"""The cells' fast sequence kernels ("fast paths"), by concern.

Every cell keeps its plain reference implementation (``Cell.forward``: one ``step`` per
time step, autograd through every operation).  A cell with a fast path declares its kernel
family (``fast_kernels = FastKernels("lstmablate.cells.kernels.<module>", ...)``, see
``lstmablate/cells/base.py``); the module is imported, and its native library built, only
when such a cell first runs.  ``tests/test_fused.py``, ``tests/test_fused_multiplicative.py``
and ``tests/test_kernels_triton.py`` compare every fast path with the reference loop.

The interface and which kernel a call takes
    ``interface.py``    ``KernelFamily``: what a family declares (what it reads from a
                        cell, its C source, its test cases) and implements (``choose``,
                        ``run``); the shared forward code, written once; the registry
    ``dispatch.py``     the choices several families share: PyTorch's kernel or ours,
                        Triton or not, how a path is named
    ``calibrate.py``    on CPU, our native kernel or PyTorch's own, by a short timing on
                        first use per machine and shape class, cached on disk
    ``switches.py``     ``reference_mode()``, ``LSTMABLATE_REFERENCE``, ``LSTMABLATE_NATIVE``,
                        ``LSTMABLATE_PACKED_GEMM``, ``LSTMABLATE_TORCH_ON_CPU``,
                        ``LSTMABLATE_TRITON``, ``LSTMABLATE_CUDA_GRAPHS``

The families, one module each (``KERNELS``), with their CPU / PyTorch loops
    ``lstm_family.py``  the LSTM ablations: PyTorch's LSTM/RNN, or ``lstm_recurrent.py``
                        (the recurrence with a hand-written BPTT) / ``lstm_scan.py``
                        (nothing reads h_{t-1})
    ``gru.py``          the GRU; its loops ``gru_recurrent.py``
    ``factored.py``     mRNN, mLSTM;  ``multi_matrix.py``: mmRNN, mmLSTM;  ``dyck.py``:
                        the Dyck-RNN; shared by them: ``second_order.py``,
                        ``step_products.py`` (packed per-step products)
    ``delegate.py``     PyTorch's fused LSTM / RNN / GRU (cuDNN, oneDNN): our weights kept
                        in their layout, a stacked encoder in one call
    ``sequences.py``    masks, input products, final states, outputs at padding

The GPU kernels (Triton, optional: imported only for CUDA calls, or for CPU tensors under
Triton's interpreter)
    ``triton_support.py``  whether Triton runs here, dtypes, launch sizes
    ``triton_common.py``   the jit helpers every Triton kernel shares (padding, h_t, dh_t),
                           launching, the loops' common buffers
    ``triton_lstm.py``     the LSTM family's step and scan kernels (and the LSTM cell's
                           arithmetic, which mLSTM and mmLSTM share)
    ``triton_gru.py``, ``triton_second_order.py``  the GRU's, the second-order cells'
    ``graphs.py``          running the time loops eagerly or captured in CUDA graphs

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
