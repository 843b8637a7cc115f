"""The Dyck task's own ``lstmablate data`` subcommands (``dyck``, ``validate-dyck``).

Registered through the ``lstmablate.commands`` entry-point group, so the core CLI
names no task's tools and the task module itself knows nothing about the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer


def register(data_app: typer.Typer) -> None:
    data_app.command("dyck")(data_dyck)
    data_app.command("validate-dyck")(data_validate_dyck)


#: the largest corpus seed: the seeds of the task's config are 64-bit integers, as every
#: integer of a config (``lstmablate.config.convert``)
MAX_CORPUS_SEED = 2**63 - 1


def check_options(**values: int | None) -> None:
    """A ConfigError naming the option (``--k``, ``--train-tokens``, ...) for a value outside
    what ``train`` allows for the same field of the task's config: its ``upper_bounds``
    (:class:`~lstmablate_tasks.dyck.task.DyckData`); a size given must be at least 1 (the
    config's 0 means "the default", which here is leaving the option out), a longest
    training string at least 3 (two brackets and END).  Options left out (None) are not
    checked."""
    from lstmablate.limits import check_int

    from .task import DyckData

    lowest = {"seed": 0, "train_max_length": 3}
    for name, value in values.items():
        if value is None:
            continue
        option = "--" + name.replace("_", "-")
        high = MAX_CORPUS_SEED if name == "seed" else DyckData.upper_bounds[name]
        hint = ("(a string holds at least two brackets and END)" if name == "train_max_length"
                else "" if name == "seed" else f"(the bound of data.{name} in `train`)")
        check_int(value, option, lowest.get(name, 1), high, hint)
    for split in ("train", "dev", "test"):
        if values.get(f"{split}_tokens") is not None and \
                values.get(f"{split}_sequences") is not None:
            from lstmablate.errors import ConfigError

            raise ConfigError(f"give at most one of --{split}-tokens and --{split}-sequences "
                              f"(the {split} split's size, in tokens or in strings).")


def check_out(out_dir: Path) -> None:
    """A ConfigError for an ``--out`` that cannot be a directory (a file, a NUL byte, a name
    too long), before anything is generated."""
    from lstmablate.errors import ConfigError
    from lstmablate.io import check_dir_path

    check_dir_path(out_dir, "--out", ConfigError)
    for folder in (out_dir, *out_dir.parents):
        if os.path.exists(folder):
            if not os.path.isdir(folder):
                raise ConfigError(f"--out {out_dir}: {folder} is a file, not a directory; give "
                                  "the directory to write train.txt, dev.txt and test.txt into. "
                                  "Nothing was written.")
            return


def check_preset(preset: str, m: int) -> None:
    """A ConfigError naming ``--preset`` or ``--m`` for an unknown preset or a depth bound it
    does not define."""
    from lstmablate.errors import ConfigError, check_choice

    from .generator import PRESETS

    check_choice("--preset", preset, tuple(PRESETS))
    if m not in PRESETS[preset].m_values:
        raise ConfigError(f"--m {m}: the preset {preset!r} is defined for --m "
                          f"{', '.join(map(str, PRESETS[preset].m_values))}.")


def data_dyck(
    out_dir: Path = typer.Option(..., "--out", metavar="DIR",
                                 help="Directory for train.txt, dev.txt, test.txt."),
    k: int = typer.Option(2, "--k", metavar="K", help="Bracket types."),
    m: int = typer.Option(4, "--m", metavar="M", help="Maximum nesting depth."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Corpus seed."),
    train_tokens: Optional[int] = typer.Option(
        None, "--train-tokens", metavar="N",
        help="Training tokens (default 200,000 unless --train-sequences is given)."),
    train_sequences: Optional[int] = typer.Option(None, "--train-sequences", metavar="N",
                                                  help="Training strings (instead of a token count)."),
    dev_tokens: Optional[int] = typer.Option(None, "--dev-tokens", metavar="N",
                                             help="Dev tokens (default 20,000)."),
    dev_sequences: Optional[int] = typer.Option(None, "--dev-sequences", metavar="N",
                                                help="Dev strings (instead of a token count)."),
    test_tokens: Optional[int] = typer.Option(None, "--test-tokens", metavar="N",
                                              help="Test tokens (default 300,000)."),
    test_sequences: Optional[int] = typer.Option(None, "--test-sequences", metavar="N",
                                                 help="Test strings (instead of a token count)."),
    train_max_length: Optional[int] = typer.Option(
        None, "--train-max-length", metavar="N",
        help="Longest training (and dev) string; test strings are longer, up to twice this. "
             "Default 8m(m-2)+60."),
    preset: Optional[str] = typer.Option(None, "--preset", metavar="NAME",
                                         help="A published corpus: second-order (m in 4, 6, 8; k=2)."),
    force: bool = typer.Option(False, "--force", help="Replace train.txt, dev.txt and test.txt "
                               "in --out if they exist."),
) -> None:
    """Write a Dyck-(k,m) corpus to files (deterministic given --seed).

    Every number is checked before anything is generated, against the bounds `train` puts on
    the same values of the task's config (data.k, data.m, data.train_tokens, ...).

    Examples:

    lstmablate data dyck --k 2 --m 4 --out dyck-files/
    lstmablate data dyck --preset second-order --m 6 --out dyck-m6/
    """
    from lstmablate.errors import ConfigError
    from lstmablate.runfolder import check_output

    from . import generator as g
    from .files import validate_file

    check_options(k=k, m=m, seed=seed, train_tokens=train_tokens,
                  train_sequences=train_sequences, dev_tokens=dev_tokens,
                  dev_sequences=dev_sequences, test_tokens=test_tokens,
                  test_sequences=test_sequences, train_max_length=train_max_length)
    check_out(out_dir)
    # never into a run folder; a corpus already there only with --force
    check_output(g.split_paths(out_dir).values(), force=force)
    if preset:
        check_preset(preset, m)
    try:
        if preset:
            splits = g.make_preset_splits(preset, m, seed=seed)
        else:
            lengths = None
            if train_max_length:
                lengths = {"train": (1, train_max_length), "dev": (1, train_max_length),
                           "test": (train_max_length + 1, 2 * train_max_length)}
            if train_tokens is None and train_sequences is None:
                train_tokens = 200_000
            splits = g.make_splits(k, m, seed=seed, train_tokens=train_tokens,
                                   train_sequences=train_sequences, dev_tokens=dev_tokens,
                                   dev_sequences=dev_sequences, test_tokens=test_tokens,
                                   test_sequences=test_sequences, lengths=lengths)
    except ValueError as e:
        raise ConfigError(f"cannot generate the Dyck corpus: {e}") from None
    for _split, path in splits.write(out_dir).items():
        stats = validate_file(path, splits.k, splits.m)
        typer.echo(f"{path}: {stats.num_sequences} strings, {stats.num_tokens} tokens, "
                   f"lengths {stats.min_length}-{stats.max_length}, max depth {stats.max_depth}")


def data_validate_dyck(
    path: Path = typer.Argument(..., metavar="FILE", help="A Dyck file, one string per line."),
    k: int = typer.Option(..., "--k", metavar="K", help="Bracket types the file may use."),
    m: int = typer.Option(..., "--m", metavar="M", help="Maximum nesting depth allowed."),
) -> None:
    """Check that every line is well-nested with depth <= m; report the first offending line.

    Example:

    lstmablate data validate-dyck dyck-files/train.txt --k 2 --m 4
    """
    from .files import validate_file

    check_options(k=k, m=m)
    s = validate_file(path, k, m)
    typer.echo(f"ok {path}: {s.num_sequences} strings, {s.num_tokens} tokens, max depth {s.max_depth}")
