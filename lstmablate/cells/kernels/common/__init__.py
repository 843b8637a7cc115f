"""What several kernel families share: the choice of a path (``dispatch.py``, with the
calibrated CPU choice ``calibrate.py``), PyTorch's fused kernels (``delegate.py``), the
work around every hand-written loop (``sequences.py``), the native (C) build and loading
(``native_build.py``, ``native.py``, and the C sources every library shares, ``la_*``),
and the Triton support (``triton_support.py``, ``triton_common.py``, ``graphs.py``).
Nothing here imports a family; see the map in ``lstmablate/cells/kernels/__init__.py``."""
