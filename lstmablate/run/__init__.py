"""Running: one run (runner), the run folder as one typed object (runs), one writer per run
(runlock), many runs (sweep), and what the data directory allows to run (data_status)."""
