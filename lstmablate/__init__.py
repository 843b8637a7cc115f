"""lstmablate: the LSTM ablations of Levy et al. (ACL 2018) on real benchmarks."""

__version__ = "0.1.0"
