"""The cells' fast sequence kernels ("fast paths"), one folder per kernel family.

Every cell keeps its plain reference implementation (``Cell.forward``: one ``step`` per
time step, autograd through every operation).  A cell with a fast path declares its kernel
family (``fast_kernels = FastKernels("lstmablate.cells.kernels.<family>.<module>", ...)``,
see ``lstmablate/cells/base.py``); the module is imported, and its native library built,
only when such a cell first runs.  ``tests/test_fused.py``,
``tests/test_fused_multiplicative.py``, ``tests/test_kernels_linear_scan.py``,
``tests/test_kernels_sru.py``, ``tests/test_kernels_additive.py`` and
``tests/test_kernels_triton.py`` compare every fast path with the reference loop.

The contract, and the environment
    ``interface.py``    ``KernelFamily``: what a family declares (what it reads from a
                        cell, its paths, its C source, its test cases) and implements
                        (``choose``, ``run``); ``KernelPath``, the paths (an enum, checked
                        at dispatch); the shared forward code, written once (autocast, the
                        fallback of a GPU path that fails); the registry; the record of the
                        paths taken (``kernel_record``)
    ``call.py``         ``Call`` and ``mask_kind``, what the dispatch knows of a call; the
                        rules every family shares around its choice (``refused``,
                        ``runs_low_precision``)
    ``switches.py``     ``reference_mode()`` and every environment variable the kernels
                        read (``SWITCHES``, listed in docs/performance.md)

One folder per family: its paths' choice, its PyTorch loops, its Triton kernels, its C loops
    ``lstm/``           the LSTM ablations: ``family.py`` (PyTorch's LSTM/RNN or ours),
                        ``recurrent.py`` (the recurrence with a hand-written BPTT),
                        ``scan.py`` (nothing reads h_{t-1}), ``triton_kernels.py``
                        (also the LSTM cell's arithmetic mLSTM and mmLSTM share),
                        ``lstm_family.c``
    ``gru/``            the GRU: ``family.py``, ``recurrent.py``, ``triton_kernels.py``,
                        ``gru.c``
    ``second_order/``   three families sharing ``shared.py``: ``factored.py`` (mRNN,
                        mLSTM), ``multi_matrix.py`` (mmRNN, mmLSTM), ``dyck.py`` (the
                        Dyck-RNN); ``step_products.py`` (packed per-step products),
                        ``triton_kernels.py``, ``second_order.c``
    ``linear_scan/``    every cell whose gates read the inputs only (``qrnn``, ``sru-2017``,
                        ``mingru``, ``minlstm``): ``family.py`` (the cell's own products and
                        gates, then one shared pass over time), ``loops.py`` (the pass and
                        its reverse pass, C or PyTorch loops), ``triton_kernels.py``,
                        ``linear_scan.c``
    ``sru/``            the 2018 SRU, whose gates read c_{t-1} element-wise: ``family.py``
                        (the cell's own products, gates and readout around one pass over
                        time), ``loops.py`` (the pass and its reverse pass, C or PyTorch
                        loops), ``triton_kernels.py``, ``sru.c``
    ``additive/``       ``ran`` and ``knn-rnn``: ``family.py`` runs each on the LSTM family's
                        kernels as the ``lstm-srnn-out`` it is (no kernels of its own)

What several families share: ``common/``
    ``dispatch.py``     the choices several families make: PyTorch's kernel or ours,
                        Triton or not, how ``lstmablate bench`` names a path
    ``calibrate.py``    on CPU, our native kernel or PyTorch's own, by a short timing on
                        first use per machine and shape class, cached on disk
    ``gemm.py``         on CPU, which GEMM (MKL's, oneDNN's, our packed one) runs a call's
                        large products (the products of all steps and their gradients),
                        whichever is fastest here
    ``delegate.py``     PyTorch's fused LSTM / RNN / GRU (cuDNN, oneDNN): our weights kept
                        in their layout, a stacked encoder in one call
    ``sequences.py``    the padding-free (packed) layout of a call, input products
    ``native_build.py`` compiling one library per family (compiler, flags, cache key,
                        private cache directory, remembered failures) from the family's
                        C source and the shared ``la_blas.[ch]``, ``la_gemm.c``, ``la_real.h``
    ``native.py``       loading it: signatures read from the C sources, checked calls, the
                        BLAS PyTorch uses, a self-test on load
    ``triton_support.py``  whether Triton runs here, dtypes, launch sizes (Triton is
                        optional: its modules are imported only for CUDA calls, or for CPU
                        tensors under Triton's interpreter)
    ``triton_common.py``   the jit helpers every Triton kernel shares (padding, h_t, dh_t),
                        launching, the loops' common buffers
    ``graphs.py``       running the Triton time loops eagerly or captured in CUDA graphs
                        (the capture policy: after three sightings, bounded slots)
    ``guard.py``        a Triton backward that fails: its gradients recomputed on the
                        PyTorch function of the same inputs (the forward's fallback is
                        ``interface.KernelFamily._run``)
    ``precision.py``    the float32 products' TF32 flags, read and set alike for cuBLAS and
                        cuDNN (what ``train.precision`` and a fair benchmark need); the dtype
                        a memory cell is carried in

A family's folder imports ``common/``, ``interface.py``, ``call.py`` and ``switches.py``, and
no other family's folder, except that ``second_order/`` builds on the LSTM cell's arithmetic
of ``lstm/`` (mLSTM's, mmLSTM's blocks are the LSTM's) and ``additive/`` runs ``lstm/``'s
kernels; ``common/`` imports no family; ``interface.py`` imports only ``call.py`` and
``switches.py``, ``call.py`` only ``switches.py``, which imports nothing
(``tests/test_kernels_layout.py``).
Adding a family or a path: docs/design/adding-a-kernel-family.md; what each family's paths
compute: the README.md in its folder.

No ``__init__`` here imports anything, so importing any one module pulls in only what that
module needs.
"""
