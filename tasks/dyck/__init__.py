"""The m-bounded Dyck-k probe (Hewitt et al., EMNLP 2020): data generation and metrics."""
