"""What the commands share: help texts of the options several commands take, the check of
``--out DIR`` (the runs tree), and the significance tests' options of ``compare`` and
``report``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..errors import UserError


def out_dir_path(text: str) -> Path:
    """The value of ``--out DIR`` (the runs tree): an empty one is refused (it would mean the
    current folder without saying so)."""
    if not text.strip():
        raise UserError(f"--out {text!r} is empty; give the directory of the runs tree "
                        "(e.g. --out runs). Nothing was written.")
    return Path(text)


DATA_DIR_HELP = "Data directory (default: $LSTMABLATE_DATA, else ./data)."
DEVICE_HELP = "cpu, cuda, cuda:N or auto (cuda when available)."
THREADS_HELP = ("torch CPU threads (default: the cores this process may use less the machine's "
                "load, at least 1; OMP_NUM_THREADS if set).")
PLAIN_HELP = "Tab-separated values, one row per line (the default when output is not a terminal)."


def significance_option(name: str, prefix: str = "") -> Any:
    """``--test``, ``--level``, ``--resamples``, ``--seed`` or ``--correction`` of the
    significance tests, as ``compare`` and ``report`` take them (their bounds and choices:
    lstmablate.results.compare.check_settings)."""
    default, metavar, what = {
        "--test": ("permutation", "permutation|sacrebleu", "the test over items: the paired "
                   "permutation test with the bootstrap interval, or sacreBLEU's paired "
                   "bootstrap (to quote sacreBLEU's p-values; it over-claims, docs/reporting.md)"),
        "--level": (0.05, "ALPHA", "significance level, in (0, 0.5]"),
        "--resamples": (None, "N", "shuffles or resamples, 200 to 100,000 (default: 10,000 "
                        "shuffles; sacreBLEU's 1,000 resamples with --test sacrebleu)"),
        "--seed": (12345, "N", "seed of the shuffles and resamples (sacreBLEU's default 12345)"),
        "--correction": ("holm", "holm|bh|none", "how the table's comparisons are corrected "
                         "together: Holm-Bonferroni (family-wise error), Benjamini-Hochberg "
                         "(false discovery rate) or none"),
    }[name]
    return typer.Option(default, name, metavar=metavar,
                        help=f"{prefix}{what}." if prefix else f"{what[0].upper()}{what[1:]}.")
