"""The options of ``sweep --launcher slurm``: the command line's, the user's config file's.

Each array task asks Slurm for what :class:`SlurmOptions` holds.  The command line's options
win over the user's config file, ``$LSTMABLATE_SLURM_CONFIG`` or else
``$XDG_CONFIG_HOME/lstmablate/slurm.yaml`` (``~/.config/lstmablate/slurm.yaml``): plain YAML,
its keys the options without ``--`` (``partition: gpu``, ``time: '12:00:00'``), plus
``slurm-opts`` (more sbatch options) and ``setup`` (shell lines run before each task).  A key
or value that does not fit is one message naming the file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lstmablate.errors import ConfigError, UserError, did_you_mean

CONFIG_ENV = "LSTMABLATE_SLURM_CONFIG"
DEFAULT_TIME = "4:00:00"
#: sbatch options lstmablate (through submitit) sets itself; --slurm-opt may not change them
MANAGED = ("array", "output", "error", "signal", "open-mode", "job-name", "wrap")


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
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^\d+[KMGT]?$", re.I)
_OPT_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def parse_time(text: str | int, where: str = "--time") -> int:
    """A Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``) in whole minutes, rounded up."""
    m = _TIME.match(str(text).strip())
    if m is None or isinstance(text, bool):
        raise ConfigError(f"{where} {text!r} is not a Slurm time limit; give minutes (240), "
                          "HH:MM:SS (4:00:00) or D-HH:MM:SS (1-12:00:00).")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        h, mins, s = (nums + [0, 0])[:3]
        seconds = ((int(days) * 24 + h) * 60 + mins) * 60 + s
    elif len(nums) == 1:
        seconds = nums[0] * 60
    elif len(nums) == 2:  # MM:SS
        seconds = nums[0] * 60 + nums[1]
    else:
        seconds = (nums[0] * 60 + nums[1]) * 60 + nums[2]
    minutes = -(-seconds // 60)
    if minutes < 1:
        raise ConfigError(f"{where} {text!r}: a job needs at least one minute.")
    return minutes


def parse_slurm_opts(items: list[str], where: str = "--slurm-opt") -> dict[str, Any]:
    """``KEY=VALUE`` (or a bare ``KEY`` flag) items as ``#SBATCH --KEY=VALUE`` lines."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = str(item).partition("=")
        key = key.strip().lstrip("-")
        _check_opt_key(key, f"{where} {item!r}")
        out[key] = value if eq else True
    return out


def _check_opt_key(key: str, where: str) -> None:
    if not _OPT_KEY.match(key):
        raise ConfigError(f"{where}: {key!r} is not an sbatch option name; write KEY=VALUE, "
                          "e.g. constraint=a100 or mail-type=END.")
    if key.replace("_", "-") in MANAGED:
        raise ConfigError(f"{where}: --{key} is set by lstmablate for every sweep (the array, its "
                          "logs and the signal before the time limit); leave it out.")


def _checked(key: str, value: Any, where: str) -> Any:
    """One option's value, checked (ConfigError naming ``where``)."""
    if value is None:
        return None
    if key in ("gpus-per-job", "cpus-per-job", "array-parallelism"):
        lowest = 0 if key == "gpus-per-job" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise ConfigError(f"{where}: {key} must be a whole number of at least {lowest}, "
                              f"got {value!r}.")
        return value
    if key == "mem":
        if not _MEM.match(str(value)):
            raise ConfigError(f"{where}: mem must be a size as sbatch --mem reads it (16G, "
                              f"16000M, 16000 in MB), got {value!r}.")
        return str(value)
    if key == "time":
        parse_time(value, where)
        return str(value)
    if key == "slurm-opts":
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: slurm-opts must be a mapping of sbatch option names to "
                              f"values (constraint: a100), got {value!r}.")
        for k in value:
            _check_opt_key(str(k), where)
        return {str(k): (v if v is True else str(v)) for k, v in value.items()}
    if key == "setup":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: setup must be a list of shell lines, got {value!r}.")
        return value
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be a name, got {value!r}.")
    return str(value)


def config_path() -> Path:
    """The user's Slurm defaults: ``$LSTMABLATE_SLURM_CONFIG``, else
    ``$XDG_CONFIG_HOME/lstmablate/slurm.yaml`` (``~/.config/lstmablate/slurm.yaml``)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "lstmablate" / "slurm.yaml"


def read_config(path: Path) -> dict[str, Any]:
    """The options in a user config file (plain YAML, keys as the command-line options without
    ``--``, plus ``slurm-opts`` and ``setup``); a key or value that does not fit is a
    ConfigError naming the file and line."""
    import yaml

    from lstmablate.recipes import load_yaml

    if not path.exists():
        if os.environ.get(CONFIG_ENV) and Path(os.environ[CONFIG_ENV]) == path:
            raise ConfigError(f"{CONFIG_ENV}={path}: no such file. Point it at your Slurm defaults "
                              "(a YAML mapping such as `partition: gpu`) or unset it.")
        return {}
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of Slurm options (partition: gpu, "
                          f"time: '4:00:00', ...), got {type(data).__name__}.")
    lines = {}  # the line of each top-level key (yaml.compose builds nodes, never objects)
    node = yaml.compose(path.read_text(encoding="utf-8"))
    for key_node, _ in getattr(node, "value", []):
        lines[str(key_node.value)] = key_node.start_mark.line + 1
    out = {}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        where = f"{path}, line {lines.get(str(key), '?')}"
        if name not in _OPTION_KEYS:
            close = did_you_mean(name, _OPTION_KEYS)
            raise ConfigError(f"{where}: unknown key {key!r}."
                              + (f" Did you mean {close!r}?" if close else "")
                              + " The keys are the sweep's Slurm options without `--`: "
                              + ", ".join(_OPTION_KEYS) + ".")
        out[name.replace("-", "_")] = _checked(name, value, where)
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


def check_launcher(launcher: str, slurm: dict[str, Any], *, dry_run: bool, jobs: int,
                   runs_nothing: bool) -> None:
    """UserError for options that do not go together: Slurm options (``--dry-run`` too)
    without ``--launcher slurm`` or with ``--list``/``--status`` (``runs_nothing``), ``--jobs``
    with ``--launcher slurm``."""
    if launcher not in ("local", "slurm"):
        raise UserError(f"--launcher {launcher!r}: expected local (run here) or slurm (submit "
                        "one Slurm array job).")
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
