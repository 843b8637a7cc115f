"""The bounds every command checks a user's numbers against, in one place.

``train``, ``sweep``, ``bench``, ``data``, ``compare`` and ``report`` take some of the same
kinds of number (a seed, a thread count, a count of resamples, a significance level), and the
readers of the toolkit's own files (recipes, ``config.yaml``, ``result.json``,
``metrics.jsonl``, ``slurm.yaml``) share one bound on size and on nesting.  Each bound is
spelled here once, with the reason for it, and each check raises a one-paragraph
:class:`~lstmablate.errors.UserError` naming the option, the value and the allowed range.
:func:`fits` says whether a value read from a file (a checkpoint's part, a cell's option) is
plain data of its declared type, exactly, and :func:`described` says that type in words.

A leaf module: it imports nothing of the toolkit's but the errors.
"""

from __future__ import annotations

import math
import os
import sys
import types
import typing
from typing import Any

from .errors import ConfigError, UserError

#: the largest run seed: Python's, numpy's (2**32 - 1) and torch's generators all take it
MAX_SEED = 2**32 - 1

#: the largest file the toolkit reads as one YAML or JSON document (a recipe, a run's
#: config.yaml / result.json / env.json, slurm.yaml, an artefact); the largest it writes, a
#: vocabulary artefact, is a few MB
MAX_DOCUMENT_BYTES = 256 * 2**20

#: the largest line of a JSON-lines file (metrics.jsonl, scores/<split>.jsonl): an
#: evaluation's metrics or one item's scores are a few hundred bytes; and of a data file read
#: line by line (a pretrained vectors file: a line of GloVe 840B is about 3 KB)
MAX_LINE_BYTES = 16 * 2**20

#: how deeply a YAML or JSON document the toolkit reads may nest (the deepest it writes nests
#: four levels; readers downstream walk documents recursively)
MAX_DEPTH = 32

#: resamples of a bootstrap, permutation or ASO test: more than this costs hours and memory
#: without moving a p-value's second digit (its standard error at R = 100,000 is below 0.001)
MAX_RESAMPLES = 100_000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, option: str, low: int, high: int, hint: str = "") -> int:
    """``value`` as an integer in ``low..high``, else a ConfigError naming ``option``."""
    if not _is_int(value) or not low <= value <= high:
        shown = repr(value) if not _is_int(value) or abs(value) < 10**20 else f"{str(value)[:12]}..."
        raise ConfigError(f"{option} must be an integer between {low:,} and {high:,}, got "
                          f"{shown}." + (f" {hint}" if hint else ""))
    return value


def check_float(value: Any, option: str, low: float, high: float, hint: str = "",
                *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float in the range (open at an end where asked), else a
    ConfigError naming ``option``."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (low < value if low_open else low <= value)
          and (value < high if high_open else value <= high))
    if not ok:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ConfigError(f"{option} must be a number in {lo}{low:g}, {high:g}{hi}, got {value!r}."
                          + (f" {hint}" if hint else ""))
    return float(value)


def check_seed(seed: Any, source: str = "--seed") -> int:
    """A run seed (or a seed of resampling): an integer in 0..MAX_SEED."""
    if not is_seed(seed):
        shown = repr(seed) if not _is_int(seed) or abs(seed) < 10**20 else f"{str(seed)[:12]}..."
        raise ConfigError(f"{source}: a seed must be an integer between 0 and {MAX_SEED:,} "
                          f"(2**32 - 1), got {shown}")
    return seed


def max_threads() -> int:
    """The most CPU threads a command may ask for: four per core of this machine (more only
    slows a run down; far more crashes the OpenMP runtime)."""
    return 4 * (os.cpu_count() or 1)


def check_threads(threads: int | None, option: str = "--threads",
                  default: str = "PyTorch's default") -> None:
    """UserError unless ``threads`` is None (torch's default) or 1..max_threads(); ``default``
    says what leaving the option out gives (``bench``: 2 threads)."""
    if threads is None:
        return
    if not _is_int(threads) or not 1 <= threads <= max_threads():
        raise UserError(f"{option} must be between 1 and {max_threads()} (four per CPU core of "
                        f"this machine), got {threads!r}; leave it out for {default}.")


def check_resamples(n: Any, option: str = "--resamples", minimum: int = 1) -> int:
    """A number of resamples in ``minimum``..MAX_RESAMPLES."""
    return check_int(n, option, minimum, MAX_RESAMPLES,
                     f"({MAX_RESAMPLES:,} already gives p-values to three decimals.)")


def is_number(value: Any) -> bool:
    """A number as a run's records hold one (a metric, a time, a per-item statistic): an int or
    a float, NaN and the infinities included (a diverged evaluation writes them; readers
    leave them out where they average), never a bool or a string, nor an integer too large
    to become a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, float) or abs(value) <= sys.float_info.max


def is_seed(value: Any) -> bool:
    """Whether ``value`` is a run seed (or a seed of resampling): an integer in 0..MAX_SEED."""
    return _is_int(value) and 0 <= value <= MAX_SEED
#: the largest ``init_scale`` (every parameter uniform(±init_scale)) of a model or a cell: the
#: original systems use 0.04-0.1; beyond 10 every gate saturates at the first step, and
#: beyond ~3e38 the bound is not even a float32 (PyTorch fails with a traceback)
MAX_INIT_SCALE = 10.0


def fits(value: Any, tp: Any, *, finite: bool = True) -> bool:
    """Whether ``value`` is plain data of the annotation ``tp``, exactly (nothing converted):
    a bool; an int (never a bool); a float (an int or a float, never a bool; finite unless
    ``finite`` is False); a str; None where ``tp`` admits it; a dict, list or tuple of such.
    An annotation of another kind (a class, a Literal) is not judged here: True."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(value is None if a is type(None) else fits(value, a, finite=finite)
                   for a in args)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return _is_int(value)
    if tp is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (math.isfinite(value) or not finite))
    if tp is str:
        return isinstance(value, str)
    if origin is dict or tp is dict:
        key, val = args or (Any, Any)
        return isinstance(value, dict) and all(
            fits(k, key, finite=finite) and fits(v, val, finite=finite) for k, v in value.items())
    if origin in (list, tuple):
        inner = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(fits(v, inner, finite=finite)
                                                        for v in value)
    return True  # (the reader of the value checks what it is)


def described(tp: Any) -> str:
    """The annotation ``tp`` in words, for a message (``float | None``: "a finite number or
    none")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("none" if a is type(None) else described(a) for a in args)
    if origin is dict or tp is dict:
        return "a mapping" + (f" (each value {described(args[1])})" if args else "")
    if origin in (list, tuple):
        return "a list"
    return {bool: "true or false", int: "a whole number", float: "a finite number",
            str: "a string"}.get(tp, str(tp))
