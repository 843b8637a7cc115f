"""Data directory, dataset catalogue and checked reading of data files.

Every task reads its files through this package, so that all of them share one
behaviour (documented for users in ``data/README.md``):

* **Where.** :func:`resolve_data_dir` picks the data directory: the
  ``--data-dir`` value, else the environment variable ``LSTMABLATE_DATA``,
  else ``./data`` relative to the current working directory.  A file there
  is refused; a missing directory is refused only by the commands that look at
  data already there (:func:`require_data_dir`).
* **What.** A :class:`Dataset` lists a dataset's files (paths relative to the
  data directory), their checksums (sha256 and md5 of the *decompressed*
  file), canonical download locations and licence.  The catalogue entries
  belong to the tasks (``Task.datasets``); this package names no dataset.
* **Gzip.** :func:`find_file` accepts ``name`` or ``name.gz``; every reader
  here decompresses ``.gz`` files transparently.
* **Checked.** :func:`read_text` / :func:`read_lines` / :func:`open_text`
  (and :func:`iter_lines`, streamed, for files too big to hold) decode UTF-8
  strictly and turn every problem (missing, not a regular file, empty,
  truncated gzip, non-UTF-8 byte, NUL character) into a
  :class:`~lstmablate.errors.DataError` whose message names the file (and the
  line where relevant).  Every task reads its text through them, so a check
  added here holds for every task. :func:`check_file`
  and :func:`verify` compare checksums; a success is remembered per
  (path, size, mtime) for the rest of the process.
* **Fetch.** :func:`fetch` downloads a dataset from its canonical URLs,
  verifies it and writes each file atomically.

Its modules, each a part of the above: ``catalogue`` (what), ``location`` (where),
``read`` (gzip, checked), ``checksums`` and ``download`` (fetch); their public names are
handed on here, where every caller imports them.
"""

from .catalogue import DataFile, Dataset, get_dataset, known_datasets, register_datasets
from .checksums import CheckResult, check_file, file_digest, verify, verify_datasets
from .download import fetch
from .location import (DEFAULT_DATA_DIR, ENV_VAR, describe_data_dir, find_file, require_data_dir,
                       resolve_data_dir)
from .read import iter_lines, open_text, read_lines, read_text

__all__ = [
    "DEFAULT_DATA_DIR",
    "ENV_VAR",
    "DataFile",
    "Dataset",
    "CheckResult",
    "register_datasets",
    "known_datasets",
    "verify_datasets",
    "resolve_data_dir",
    "describe_data_dir",
    "require_data_dir",
    "get_dataset",
    "find_file",
    "open_text",
    "read_text",
    "read_lines",
    "iter_lines",
    "file_digest",
    "check_file",
    "verify",
    "fetch",
]
