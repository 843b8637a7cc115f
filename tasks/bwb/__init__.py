"""The One Billion Word Benchmark task plugin (``bwb``): Józefowicz et al.'s LSTM-2048-512."""
