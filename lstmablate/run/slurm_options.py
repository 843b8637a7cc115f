"""The options of ``sweep --launcher slurm``: the command line's, the user's config file's.

Each array task asks Slurm for what :class:`SlurmOptions` holds.  The command line's options
win over the user's config file, ``$LSTMABLATE_SLURM_CONFIG`` or else
``$XDG_CONFIG_HOME/lstmablate/slurm.yaml`` (``~/.config/lstmablate/slurm.yaml``): plain YAML,
its keys the options without ``--`` (``partition: gpu``, ``time: '12:00:00'``), plus
``slurm-opts`` (more sbatch options) and ``setup`` (shell lines run before each task).

Every value, from either place, is checked here by one function (:func:`_checked`) before it
reaches the sbatch script submitit writes: a value is refused with one message naming the
option (or the file and line) and what is accepted.  The script is a shell script whose
``#SBATCH`` lines are comments to the shell and options to sbatch, so no value may carry a line
break or any other character that is not printable (a value split over two lines would put
its second half on a line the shell runs), and a value of an ``#SBATCH`` line is also kept
from what sbatch itself reads specially there (:func:`sbatch_value_problem`).  submitit quotes
each ``#SBATCH`` value (``shlex.quote``), which sbatch unquotes as the shell would; names
(partition, account, qos) are plain Slurm names anyway, and numbers are bounded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lstmablate.errors import ConfigError, UserError, did_you_mean
from lstmablate.limits import check_int

CONFIG_ENV = "LSTMABLATE_SLURM_CONFIG"
DEFAULT_TIME = "4:00:00"
#: sbatch options lstmablate (through submitit) sets itself; --slurm-opt may not change them
MANAGED = ("array", "output", "error", "signal", "open-mode", "job-name", "wrap")
#: sbatch options the sweep's own options write (None: every task is one node, one Slurm
#: task); --slurm-opt names the option to use instead of each
OWN = {"partition": "--partition", "gpus-per-node": "--gpus-per-job",
       "cpus-per-task": "--cpus-per-job", "mem": "--mem", "time": "--time",
       "account": "--account", "qos": "--qos", "nodes": None, "ntasks-per-node": None}
#: sbatch options whose whole name begins another one's in MANAGED or OWN (``--gpus`` and
#: ``--gpus-per-node``): sbatch reads an abbreviated option name (``--arr`` for ``--array``),
#: so a shorter name is refused unless it is one of these
_WHOLE_NAMES = ("gpus", "ntasks")

#: the longest time limit (days): far above what any cluster grants a job
MAX_DAYS = 365
#: GPUs of one node: the largest nodes have 8 to 16
MAX_GPUS = 64
#: CPUs of one task (one node): the largest nodes have a few hundred cores
MAX_CPUS = 4096
#: memory of one node in MB (64T): the largest nodes have a few terabytes
MAX_MEM_MB = 64 * 2**20
#: array tasks at once (Slurm's array size limit is itself at most four million)
MAX_PARALLEL = 100_000
#: the longest value written into the script (a --comment, a --mail-user, a list of nodes)
MAX_VALUE_CHARS = 1000


@dataclass
class SlurmOptions:
    """What each array task asks Slurm for.  The command line's options win over the user's
    config file (:func:`config_path`), which wins over these defaults."""

    partition: str | None = None
    gpus_per_job: int | None = None
    cpus_per_job: int | None = None
    mem: str | None = None
    time: str = DEFAULT_TIME
    account: str | None = None
    qos: str | None = None
    array_parallelism: int | None = None
    #: further ``#SBATCH --KEY=VALUE`` lines (``--slurm-opt``; True: a flag without a value)
    slurm_opts: dict[str, Any] = field(default_factory=dict)
    #: shell lines run before the task (``module load ...``, activating an environment)
    setup: list[str] = field(default_factory=list)

    @property
    def time_minutes(self) -> int:
        return parse_time(self.time)

    def executor_parameters(self, job_name: str) -> dict[str, Any]:
        """submitit's ``SlurmExecutor.update_parameters`` keywords."""
        params: dict[str, Any] = {"job_name": job_name, "time": self.time_minutes,
                                  "nodes": 1, "ntasks_per_node": 1}
        for ours, theirs in (("partition", "partition"), ("gpus_per_job", "gpus_per_node"),
                             ("cpus_per_job", "cpus_per_task"), ("mem", "mem"),
                             ("account", "account"), ("qos", "qos"),
                             ("array_parallelism", "array_parallelism")):
            value = getattr(self, ours)
            if value is not None:
                params[theirs] = value
        if self.slurm_opts:
            params["additional_parameters"] = dict(self.slurm_opts)
        if self.setup:
            params["setup"] = list(self.setup)
        return params


_OPTION_KEYS = [f.name.replace("_", "-") for f in fields(SlurmOptions)]
_NUMBER = "[0-9]{1,9}"
_TIME = re.compile(rf"(?:({_NUMBER})-)?({_NUMBER})(?::({_NUMBER}))?(?::({_NUMBER}))?")
_MEM = re.compile(r"([0-9]{1,15})([KMGT]?)", re.I)
_MEM_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}
_NAME = "[A-Za-z0-9._+-]{1,200}"
_NAMES = {False: re.compile(_NAME), True: re.compile(rf"{_NAME}(?:,{_NAME})*")}
_OPT_KEY = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
#: words sbatch reads anywhere in an #SBATCH line as the start of a heterogeneous job's next
#: component, whatever their case
_SPLITTING_WORDS = ("hetjob", "packjob")
_TIME_FORMS = ("minutes (240), MM:SS, HH:MM:SS (4:00:00), D-HH, D-HH:MM or D-HH:MM:SS "
               f"(1-12:00:00), at least one minute and at most {MAX_DAYS} days")


def _shown(value: Any) -> str:
    """``value`` as a message shows it: repr (line breaks and control characters escaped),
    cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + "...' (" + f"{len(str(value)):,} characters)"


def line_problem(text: str) -> str | None:
    """Why ``text`` cannot be one line of a shell script (None: it can): a character that is
    not printable -- a line break to the shell (LF), to sbatch or to Python (CR, U+0085,
    U+2028, ...), NUL, a tab or another control or format character -- or more than
    MAX_VALUE_CHARS characters."""
    for ch in text:
        if not ch.isprintable():
            return (f"the character U+{ord(ch):04X}, which is not printable (a line break, a "
                    "control character or the like): a value is one line of printable text")
    if len(text) > MAX_VALUE_CHARS:
        return f"{len(text):,} characters, more than the {MAX_VALUE_CHARS:,} a value may have"
    return None


def sbatch_value_problem(text: str) -> str | None:
    """Why ``text`` cannot be the value of an ``#SBATCH`` line (None: it can): not one line
    (:func:`line_problem`), a backslash (an escape to sbatch even inside the quotes submitit
    writes, so the value sbatch reads would differ), or ``hetjob``/``packjob`` (where sbatch
    splits the job in two)."""
    problem = line_problem(text)
    if problem:
        return problem
    if "\\" in text:
        return "a backslash, which sbatch reads as an escape in an #SBATCH line"
    words = [w for w in _SPLITTING_WORDS if w in text.lower()]
    if words:
        return (f"the word {words[0]!r}, where sbatch splits an #SBATCH script into the parts of "
                "a heterogeneous job")
    return None


def parse_time(text: str | int, where: str = "--time") -> int:
    """A Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``, as sbatch documents them) in whole minutes, rounded up: at least one
    minute, at most MAX_DAYS days; a field after the first is a clock's (hours below 24,
    minutes and seconds below 60)."""
    refused = ConfigError(f"{where} {_shown(text)} is not a Slurm time limit; give "
                          f"{_TIME_FORMS}.")
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise refused
    m = _TIME.fullmatch(str(text))
    if m is None:
        raise refused
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        h, mins, s = (nums + [0, 0])[:3]
        clock = [(h, 24), (mins, 60), (s, 60)]
        seconds = ((int(days) * 24 + h) * 60 + mins) * 60 + s
    elif len(nums) == 1:
        clock, seconds = [], nums[0] * 60
    elif len(nums) == 2:  # MM:SS
        clock, seconds = [(nums[1], 60)], nums[0] * 60 + nums[1]
    else:  # HH:MM:SS
        clock = [(nums[1], 60), (nums[2], 60)]
        seconds = (nums[0] * 60 + nums[1]) * 60 + nums[2]
    minutes = -(-seconds // 60)
    if any(v >= top for v, top in clock) or not 1 <= minutes <= MAX_DAYS * 24 * 60:
        raise refused
    return minutes


def _mem(value: Any, label: str) -> str:
    """A memory size as sbatch --mem reads it: a whole number with an optional K, M, G or T
    (MB without one; 0: all the node's memory), at most MAX_MEM_MB."""
    m = None if isinstance(value, bool) else _MEM.fullmatch(str(value))
    if m is None or int(m.group(1)) * _MEM_MB[m.group(2).upper()] > MAX_MEM_MB:
        raise ConfigError(f"{label} must be a size as sbatch --mem reads it: a whole number with "
                          "K, M, G or T (16G, 16000M; a number alone is MB, 0 all the node's "
                          f"memory), at most {MAX_MEM_MB // 2**20}T; got {_shown(value)}.")
    return str(value)


def _name(value: Any, label: str, kind: str) -> str:
    """A Slurm name (of a partition, an account, a QOS): letters, digits and ``. _ - +``; for a
    partition, a comma-separated list of names too (sbatch --partition takes one)."""
    several = kind == "partition"
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not _NAMES[several].fullmatch(text):
        names = ("an " if kind[0] in "aeiou" else "a ") + f"{kind} name" + \
            (", or several separated by commas," if several else "")
        raise ConfigError(f"{label} must be {names} as Slurm spells it: letters, digits and "
                          ". _ - + (no spaces, quotes, shell characters or line breaks); got "
                          f"{_shown(value)}.")
    return text


def _slurm_opt(key: Any, value: Any, label: str) -> tuple[str, str | bool]:
    """One further sbatch option: its name (``_`` written ``-``) and its value (True: a flag
    written without one)."""
    name = str(key).replace("_", "-")
    if not isinstance(key, str) or len(key) > 40 or not _OPT_KEY.fullmatch(key):
        raise ConfigError(f"{label}: {_shown(key)} is not an sbatch option name (lowercase "
                          "letters, digits and hyphens: constraint, mail-type); write "
                          "KEY=VALUE, e.g. constraint=a100, or KEY alone for a flag.")
    if name in MANAGED:
        raise ConfigError(f"{label}: --{name} is set by lstmablate for every sweep (the array, its "
                          "logs and the signal before the time limit); leave it out.")
    if name in OWN:
        instead = (f"give it as {OWN[name]} (or `{OWN[name][2:]}:` in the config file)"
                   if OWN[name] else "each task is one node, one Slurm task")
        raise ConfigError(f"{label}: --{name} is written by the sweep itself; {instead}.")
    shortened = [n for n in (*MANAGED, *OWN) if n.startswith(name)]
    if shortened and name not in _WHOLE_NAMES:
        raise ConfigError(f"{label}: sbatch would read --{name} as --{shortened[0]} (it takes "
                          "abbreviated option names), which lstmablate sets; leave it out or "
                          "write the whole name of the option meant.")
    if value is True:
        return name, True
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or value == "":
        raise ConfigError(f"{label}: --{name} needs a value (text or a number), or true for a "
                          f"flag written without one; got {_shown(value)}.")
    problem = sbatch_value_problem(str(value))
    if problem:
        raise ConfigError(f"{label}: the value {_shown(value)} of --{name} cannot go into an "
                          f"#SBATCH line: it has {problem}.")
    return name, str(value)


def _setup_line(line: Any, label: str) -> str:
    """One shell line of ``setup``: one printable line, and not an ``#SBATCH`` line (sbatch
    would read it as an option, past the checks above)."""
    if not isinstance(line, str):
        raise ConfigError(f"{label}: each item of setup is a shell line (text), got "
                          f"{_shown(line)}.")
    problem = line_problem(line)
    if not problem and line.lstrip().startswith(("#SBATCH", "#SLURM")):
        problem = "an #SBATCH line (give sbatch options under slurm-opts)"
    if problem:
        raise ConfigError(f"{label}: {_shown(line)} has {problem}; setup is a list of shell "
                          "lines, each one line of the script.")
    return line


def _checked(key: str, value: Any, label: str,
             item_label: Callable[[Any], str] | None = None) -> Any:
    """One option's value, checked: the one path for the command line's options and the
    config file's keys.  ``label`` names the option in a message (``--mem``, or ``FILE, line
    N: mem``); ``item_label(key or index)`` an entry of ``slurm-opts`` or ``setup``."""
    item_label = item_label or (lambda sub: f"{label} {sub}")
    if value is None:
        return None
    if key in ("gpus-per-job", "cpus-per-job", "array-parallelism"):
        low, high = (0, MAX_GPUS) if key == "gpus-per-job" else \
            (1, MAX_CPUS) if key == "cpus-per-job" else (1, MAX_PARALLEL)
        return check_int(value, label, low, high)
    if key == "mem":
        return _mem(value, label)
    if key == "time":
        parse_time(value, label)
        return str(value)
    if key in ("partition", "account", "qos"):
        return _name(value, label, "QOS" if key == "qos" else key)
    if key == "slurm-opts":
        if not isinstance(value, dict):
            raise ConfigError(f"{label} must be a mapping of sbatch option names to values "
                              f"(constraint: a100), got {_shown(value)}.")
        return dict(_slurm_opt(k, v, item_label(k)) for k, v in value.items())
    if key == "setup":
        if not isinstance(value, list):
            raise ConfigError(f"{label} must be a list of shell lines, got {_shown(value)}.")
        return [_setup_line(line, item_label(i)) for i, line in enumerate(value)]
    raise AssertionError(f"no check for the Slurm option {key}")


def parse_slurm_opts(items: list[str], where: str = "--slurm-opt") -> dict[str, Any]:
    """``KEY=VALUE`` (or a bare ``KEY`` flag) items as ``#SBATCH --KEY=VALUE`` lines."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = str(item).partition("=")
        name, checked = _slurm_opt(key.strip().lstrip("-"), value if eq else True,
                                   f"{where} {_shown(item)}")
        out[name] = checked
    return out


def config_path() -> Path:
    """The user's Slurm defaults: ``$LSTMABLATE_SLURM_CONFIG``, else
    ``$XDG_CONFIG_HOME/lstmablate/slurm.yaml`` (``~/.config/lstmablate/slurm.yaml``)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "lstmablate" / "slurm.yaml"


def _read_nodes(text: str) -> tuple[dict[tuple[str, ...], int], dict[str, str]]:
    """Of a YAML document that :func:`parse_yaml` has read (``yaml.compose`` builds nodes,
    never objects): the line of each top-level key, ``(key,)``, and of each entry of a
    top-level mapping or list, ``(key, entry key or index)``; and each top-level plain value
    as written (YAML 1.1 reads ``time: 4:00:00`` as the number 14400, in base 60)."""
    import yaml

    lines: dict[tuple[str, ...], int] = {}
    written: dict[str, str] = {}
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    for key_node, value_node in getattr(node, "value", None) or []:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        key = str(key_node.value)
        lines[(key,)] = key_node.start_mark.line + 1
        if isinstance(value_node, yaml.ScalarNode) and value_node.style is None:
            written[key] = value_node.value
        elif isinstance(value_node, yaml.MappingNode):
            for sub, _ in value_node.value:
                lines[(key, str(sub.value))] = sub.start_mark.line + 1
        elif isinstance(value_node, yaml.SequenceNode):
            for i, sub in enumerate(value_node.value):
                lines[(key, str(i))] = sub.start_mark.line + 1
    return lines, written


def read_config(path: Path) -> dict[str, Any]:
    """The options in a user config file (plain YAML, keys as the command-line options without
    ``--``, plus ``slurm-opts`` and ``setup``), read once through the bounded readers of
    :mod:`lstmablate.io` (a FIFO or device refused, size and nesting bounded); a key or value
    that does not fit is a ConfigError naming the file and line."""
    from lstmablate.io import parse_yaml, read_text

    if not path.exists():
        if os.environ.get(CONFIG_ENV) and Path(os.environ[CONFIG_ENV]) == path:
            raise ConfigError(f"{CONFIG_ENV}={path}: no such file. Point it at your Slurm defaults "
                              "(a YAML mapping such as `partition: gpu`) or unset it.")
        return {}
    text = read_text(path, error=ConfigError)
    data = parse_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of Slurm options (partition: gpu, "
                          f"time: '4:00:00', ...), got {type(data).__name__}.")
    lines, written = _read_nodes(text)

    def at(*keys: Any) -> str:
        line = lines.get(tuple(str(k) for k in keys)) or lines.get((str(keys[0]),))
        return f"{path}, line {line or '?'}"

    out = {}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        if name not in _OPTION_KEYS:
            close = did_you_mean(name, _OPTION_KEYS)
            raise ConfigError(f"{at(key)}: unknown key {_shown(key)}."
                              + (f" Did you mean {close!r}?" if close else "")
                              + " The keys are the sweep's Slurm options without `--`: "
                              + ", ".join(_OPTION_KEYS) + ".")
        if name == "time" and isinstance(value, int) and ":" in written.get(str(key), ""):
            value = written[str(key)]  # the clock time written, not YAML's base-60 number
        out[name.replace("-", "_")] = _checked(
            name, value, f"{at(key)}: {name}",
            lambda sub, key=key, name=name: f"{at(key, sub)}: {name}")
    return out


def slurm_options(cli: dict[str, Any], config: Path | None = None) -> SlurmOptions:
    """The options of a submission: ``cli`` (keyword -> value; None: not given on the command
    line) over the config file over the defaults."""
    path = config or config_path()
    merged = read_config(path)
    for key, value in cli.items():
        if key == "slurm_opts":
            value = {**merged.get("slurm_opts", {}), **parse_slurm_opts(value or [])}
        elif value is not None:
            value = _checked(key.replace("_", "-"), value, "--" + key.replace("_", "-"))
        if value is not None:
            merged[key] = value
    return SlurmOptions(**merged)


def check_runs_folder(folder: Path, option: str = "--out") -> None:
    """UserError unless ``folder`` (absolute: where submitit keeps a submission's files) can be
    written into the sbatch script, where it is the jobs' log path: an ``#SBATCH`` value
    (:func:`sbatch_value_problem`) without ``%``, which Slurm reads in a log path as the start
    of a job number or name."""
    text = str(folder)
    problem = sbatch_value_problem(text) or ("a %, which Slurm replaces in a log path (%j: the "
                                             "job number)" if "%" in text else None)
    if problem:
        raise UserError(f"{option}: the runs folder {_shown(text)} goes into the sbatch script as "
                        f"the jobs' log path, and it has {problem}. Give the sweep an --out "
                        "folder whose absolute path is one line of printable text without % or "
                        "backslashes.")


def check_launcher(launcher: str, slurm: dict[str, Any], *, dry_run: bool, jobs: int,
                   runs_nothing: bool) -> None:
    """UserError for options that do not go together: Slurm options (``--dry-run`` too)
    without ``--launcher slurm`` or with ``--list``/``--status`` (``runs_nothing``), ``--jobs``
    with ``--launcher slurm``."""
    if launcher not in ("local", "slurm"):
        raise UserError(f"--launcher {_shown(launcher)}: expected local (run here) or slurm "
                        "(submit one Slurm array job).")
    given = [f"--{k.replace('_', '-')}" for k, v in slurm.items() if v not in (None, [])]
    given += ["--dry-run"] if dry_run else []
    if given and runs_nothing:
        raise UserError(f"{', '.join(given)}: option(s) of a submission to Slurm; --list and "
                        "--status submit nothing: leave them out.")
    if given and launcher != "slurm":
        raise UserError(f"{', '.join(given)}: option(s) of --launcher slurm; add --launcher slurm "
                        "to submit the sweep to Slurm, or leave them out to run it here.")
    if launcher == "slurm" and jobs != 1:
        raise UserError("--jobs runs several runs at once on this machine; with --launcher slurm "
                        "every run is its own array task (--array-parallelism limits how many run "
                        "at once).")
