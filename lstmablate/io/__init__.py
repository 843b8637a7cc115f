"""The bottom floor: every file the toolkit writes, reads back as JSON or YAML, or records about
the machine goes through here, in three modules whose names ``lstmablate.io`` hands on (the
one import path of the house, the task plugins' included):

* :mod:`.write` -- **the output rule**, applied by :func:`atomic_write` and its
  text/JSON/YAML/gzip forms, the one writer of the package: a regular file (or a name not yet
  taken) is replaced atomically; a character device or a named pipe is written into as a
  stream, never renamed over; anything else is refused.  And **row streams** (:func:`append_text`,
  :func:`append_json_line`): one line more at the end of a regular file, fsync'd before the
  call returns.
* :mod:`.read` -- **reading**: regular files only (a FIFO or a device is refused, never waited
  on or read forever), bounded in size, line length and nesting (:mod:`lstmablate.limits`);
  YAML and JSON parsed with a damaged file named in one message; the checks of a path the user
  gave.
* :mod:`.machine` -- **the environment record** (:func:`environment`): versions, git commit,
  processor, device, threads and command line -- what ``env.json`` and the benchmarks record.

Only the standard library is imported here at start-up (PyYAML where YAML is read or
written): ``python -m lstmablate.bench.gpu_check`` and the GPU-window tool write through this
package on a machine where nothing else is installed yet.  No other module renames, replaces
or fsyncs a file, but for the exceptions ``tests/test_output_rule.py`` names with their reason
(the native build's compiled library, which the compiler writes and the build renames into
its cache).
"""

from .machine import environment, git_commit, package_version, processor_name
from .read import (GZIP_SUFFIX, check_depth, check_dir_path, load_yaml, open_regular, parse_json,
                   parse_yaml, path_exists, read_json, read_lines, read_tail, read_text)
from .write import (FIFO_WAIT_S, FILE, RUN_AGAIN, STREAM, append_json_line, append_text,
                    atomic_write, atomic_write_as_named, atomic_write_gzip, atomic_write_json,
                    atomic_write_text, atomic_write_yaml, check_can_write, is_stream, output_kind,
                    remove_interrupted_writes, write_failed)

__all__ = [
    "FIFO_WAIT_S", "FILE", "GZIP_SUFFIX", "RUN_AGAIN", "STREAM", "append_json_line", "append_text",
    "atomic_write", "atomic_write_as_named", "atomic_write_gzip", "atomic_write_json",
    "atomic_write_text",
    "atomic_write_yaml", "check_can_write", "check_depth", "check_dir_path", "environment",
    "git_commit", "is_stream", "load_yaml", "open_regular", "output_kind", "package_version",
    "parse_json", "parse_yaml", "path_exists", "processor_name", "read_json", "read_lines",
    "read_tail", "read_text", "remove_interrupted_writes", "write_failed",
]
