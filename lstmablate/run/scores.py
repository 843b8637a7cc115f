"""Per-item scores: the run folder's ``scores/<split>.jsonl.gz`` (the file name is
:class:`~lstmablate.run.runs.RunFiles`'s; this module owns the format).

The final evaluation of a split (the end-of-training test evaluation, and
``lstmablate eval RUN --split S --scores`` for a run trained before scores existed)
writes one JSON object per line, UTF-8, gzip-compressed (:func:`~lstmablate.io.atomic_write_gzip`:
no file name or time in the stream, so the bytes follow the content; a file written before
scores were compressed, ``<split>.jsonl``, is the same lines uncompressed and is read alike):

* line 1, the header: ``{"scores": 1, "task", "experiment", "cell", "seed", "split",
  "checkpoint" (best | last: the weights scored), "items" (the number of records that
  follow), "metrics" (the metrics that evaluation reported, as in result.json), and, where
  the task gives its gold side (``Task.reference_items``), "reference": the sha256 of that
  text (:func:`reference_digest`; files written before it existed have none)}``;
* then one line per item of the split, in the split's order: ``{"id": ..., <the
  sufficient statistics of the task's metrics>}`` — a sentence's summed NLL (nats) and
  token count, a parse's scored words and right heads and labels, a translation and its
  BLEU n-gram statistics, a question's EM and F1 ... (each task's ``evaluate_items``
  documents its fields).  Summing any column over any set of items and applying the
  task's ``item_metrics`` gives that set's corpus metric; over all items, the reported one.

Every statistic in a record is a count, a summed loss (a negative log-likelihood) or a
per-item score in [0, 1]: a finite number >= 0, or null where the evaluation gave none (a
non-finite value is written as null).  A boolean (JSON's ``true`` is not a number), a
negative number or an infinity is not one.

:func:`read_scores` reads such a file back and checks it so; anything else is a
one-paragraph error naming the file and line.  (That the header's cell, seed and split are
the run folder's is checked where a run's file is read: :meth:`lstmablate.run.record.Run.scores`.)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lstmablate.errors import DataError, UserError
from lstmablate.io import atomic_write_as_named, parse_json, read_lines
from lstmablate.limits import is_number, is_seed
from lstmablate.runfolder import RunNames

FORMAT = 1
HEADER_KEYS = ("task", "experiment", "cell", "seed", "split", "checkpoint", "items", "metrics")
#: header keys a file may lack (written before they existed)
OPTIONAL_KEYS = ("reference",)


def scores_command(run: Path, split: str = "test") -> str:
    """The command that writes the scores file of ``split`` for a finished run."""
    return f"lstmablate eval {run} --split {split} --scores"


def reference_digest(items: Sequence[str]) -> str:
    """``sha256:<hex>`` of a split's gold items (each as text, in order): what makes two scores
    files comparable item by item."""
    h = hashlib.sha256()
    for item in items:
        data = item.encode("utf-8")
        h.update(len(data).to_bytes(8, "little") + data)
    return "sha256:" + h.hexdigest()


@dataclass
class Scores:
    """A scores file read back: its header and the records of its items."""

    path: Path
    header: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def task(self) -> str:
        return str(self.header["task"])

    @property
    def split(self) -> str:
        return str(self.header["split"])

    @property
    def reference(self) -> str | None:
        """The sha256 of the split's gold items, if the file records it."""
        return self.header.get("reference")

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.header.get("metrics") or {})


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite number is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_scores(path: Path, header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
                 ) -> None:
    """Write ``records`` under ``header`` (its keys :data:`HEADER_KEYS` but ``items``) to
    ``path``, atomically; gzip-compressed where its name ends in ``.gz`` (a run's,
    :meth:`~lstmablate.run.runs.RunFiles.scores`), as :func:`read_scores` reads it back."""
    head = {"scores": FORMAT, **{k: header[k] for k in HEADER_KEYS if k != "items"},
            "items": len(records), **{k: header[k] for k in OPTIONAL_KEYS if header.get(k)}}
    ids = set()
    for r in records:
        if "id" not in r:
            raise ValueError("every per-item record needs an id")
        if r["id"] in ids:
            raise ValueError(f"two per-item records have the id {r['id']!r}")
        ids.add(r["id"])

    def lines() -> Iterable[bytes]:
        yield (json.dumps(_finite(head), ensure_ascii=False) + "\n").encode("utf-8")
        for r in records:
            yield (json.dumps(_finite(dict(r)), ensure_ascii=False) + "\n").encode("utf-8")

    def write(f: Any) -> None:
        for line in lines():
            f.write(line)

    atomic_write_as_named(path, write)


def _bad(path: Path, line: int, what: str) -> DataError:
    """``path`` (a run's ``scores/<split>.jsonl.gz``) is damaged at ``line``: what, and the
    command that writes it again."""
    path = Path(path)
    return DataError(f"{path}, line {line}: {what}. A scores file is a header line and one JSON "
                     f"object per item, as `{scores_command(path.parent.parent, RunNames.split_of(path))}` "
                     "writes it; the file is damaged or was not written by lstmablate (write it "
                     "again with that command).")


#: what each header key must hold (a reader's check, with the words a message uses)
_HEADER_TYPES: dict[str, tuple[Any, str]] = {
    **{k: (lambda v: isinstance(v, str), "a string")
       for k in ("task", "experiment", "cell", "split", "checkpoint")},
    "seed": (is_seed, "a run seed"),
    "items": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "the number of records"),
    "metrics": (lambda v: isinstance(v, dict) and all(x is None or is_number(x)
                                                      for x in v.values()),
                "an object mapping metric names to numbers"),
    "reference": (lambda v: isinstance(v, str) and v.startswith("sha256:"),
                  "a digest such as \"sha256:...\""),
}


def _value_problem(value: Any) -> str | None:
    """Why a record's value is not a statistic (:data:`module docstring <lstmablate.run.scores>`):
    a boolean, a negative or non-finite number, anywhere in it; None if it is one (text, such
    as a translation, and null are kept as they are)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, bool):
            return f"{str(v).lower()}, a boolean, where a statistic is a number"
        if isinstance(v, (int, float)):
            if not math.isfinite(v):
                return f"{v}, not a finite number (lstmablate writes null for one)"
            if v < 0:
                return (f"{v:g}, a negative number, where a statistic (a count, a loss, a "
                        "score) is never below 0")
        elif isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
    return None


def read_scores(path: str | Path) -> Scores:
    """A scores file, checked: the header (each key of the type lstmablate writes), then
    exactly ``items`` records with unique ids.  The file is read as :func:`~lstmablate.io.
    read_lines` reads JSON lines (a regular file, bounded in size and line length; decompressed
    where its name ends in ``.gz``, a damaged gzip stream one message naming it), each line
    nested at most MAX_DEPTH deep, every statistic of every record a finite number >= 0 (or
    null)."""
    path = Path(path)
    lines = read_lines(path)
    if not lines:
        raise _bad(path, 1, "the file is empty")
    objects = []
    for lineno, line in enumerate(lines, 1):
        try:
            obj = parse_json(line, f"{path}, line {lineno}")
        except UserError:
            raise _bad(path, lineno, "not a JSON object (malformed, or nested too deeply to "
                       "read)") from None
        if not isinstance(obj, dict):
            raise _bad(path, lineno, f"a JSON {type(obj).__name__}, not an object")
        objects.append(obj)
    header, records = objects[0], objects[1:]
    missing = [k for k in HEADER_KEYS if k not in header]
    if header.get("scores") != FORMAT or missing:
        raise _bad(path, 1, f"expected the header {{\"scores\": {FORMAT}, ...}}"
                   + (f" with {', '.join(missing)}" if missing else ""))
    for key, (ok, what) in _HEADER_TYPES.items():
        if key in header and not ok(header[key]):
            raise _bad(path, 1, f"the header's {key} must be {what}, got {header[key]!r:.60}")
    if header["items"] != len(records):
        raise _bad(path, len(lines), f"the header announces {header['items']} items, the file "
                   f"holds {len(records)} (it was cut short?)")
    seen: set[Any] = set()
    for lineno, r in enumerate(records, 2):
        key = json.dumps(r.get("id"))
        if "id" not in r or key in seen:
            raise _bad(path, lineno, "a record without an id, or with the id of an earlier one")
        seen.add(key)
        for name, value in r.items():
            problem = None if name == "id" else _value_problem(value)
            if problem:
                raise _bad(path, lineno, f"the item's {str(name)[:40]!r} is {problem}")
    return Scores(path, header, records)
