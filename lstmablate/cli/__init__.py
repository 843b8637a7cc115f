"""The ``lstmablate`` command line. Thin: it parses, then calls library functions.

Every :class:`~lstmablate.errors.UserError` becomes one paragraph on stderr and
exit code 2; no traceback.  Help texts are rich markup: a literal square bracket is
written ``\\[``; messages built from data are escaped (:func:`lstmablate.console.escape`).

This module is the Typer app, its command table and :func:`main`; the commands are one module
per group (``run``: train, eval; ``results``: compare, report, list, visualize, plot; ``data``;
``sweep``; ``bench``) over the options they share (``options``).  Importing it imports no
PyTorch: :func:`main` sets OpenMP's waiting policy first.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from ..console import err, escape, out
from ..errors import UserError
from . import bench, data, results, run, sweep


class Interrupted(Exception):
    """Ctrl-C in a command before a training run had saved anything (a training run that has
    started handles Ctrl-C itself: it saves last.pt and says how to continue)."""


def _help_params(params: list[Any]) -> list[Any]:
    """The parameters as help shows them: no type placeholder after a flag (``--resume``, not
    ``--resume <bool>``), arguments by their metavar, a value placeholder from the option's
    name where none is given (commands and groups alike: ``lstmablate --version``)."""
    for p in params:
        if getattr(p, "param_type_name", "") == "argument":
            # the metavar names it already; Typer would add a type column (<path>)
            p.display_type_rich = lambda ctx: None
            continue
        if getattr(p, "param_type_name", "") != "option" or getattr(p, "metavar", None) is not None:
            continue
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        else:
            p.metavar = (p.name or "value").upper()
    return params


class HelpCommand(TyperCommand):
    """Help that reads as a user types: no type placeholder after a flag (``--resume``, not
    ``--resume <bool>``), arguments by their metavar (``RUN_DIR``, ``[RUNS_DIR]``), a value
    placeholder from the option's name where none is given."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if getattr(p, "param_type_name", "") != "argument":
                continue
            name = p.metavar or (p.name or "arg").upper()
            name += "..." if p.nargs != 1 else ""
            pieces.append(name if p.required else f"[{name}]")
        return pieces


class Group(TyperGroup):
    """A command group (``lstmablate``, ``lstmablate data``): Ctrl-C anywhere in a command,
    from the parsing of its options on, reaches :func:`main` as :class:`Interrupted` (Typer
    would turn a KeyboardInterrupt into an exit 130 without a word)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))  # (`--version`, not `--version <bool>`)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # (a command that handles Ctrl-C itself never lets it out)
            raise Interrupted from None


class App(typer.Typer):
    """A Typer whose commands (the plugins' ``data`` subcommands too) use :class:`HelpCommand`,
    in groups of the class :class:`Group`."""

    def __init__(self, **kwargs: Any):
        super().__init__(cls=Group, **kwargs)

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or HelpCommand, **kwargs)


def _version(value: bool) -> None:
    if not value:
        return
    from .. import __version__
    from ..io import git_commit

    git = git_commit()
    where = ""
    if git.get("commit"):
        where = f" (git {git['commit'][:12]}{', uncommitted changes' if git.get('dirty') else ''})"
    out.print(f"lstmablate {__version__}{where}")
    raise typer.Exit()


app = App(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
          help="Reproduce and extend the LSTM ablations of Levy et al. (ACL 2018): train any "
               "registered cell on any task plugin, then print paper-ready tables.\n\n"
               "Start with: lstmablate list recipes; lstmablate sweep dyck-demo; "
               "lstmablate report runs --table dyck-demo")
data_app = App(no_args_is_help=True,
               help="Data directory: where it is, what is there, checks, downloads, and the "
                    "tasks' own tools.")
app.add_typer(data_app, name="data")


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version (and git commit) and exit.")) -> None:
    """Reproduce and extend the LSTM ablations of Levy et al. (ACL 2018)."""


#: the command table, in the order of `lstmablate --help`
app.command()(run.train)
app.command("eval")(run.eval_)
app.command()(results.compare)
app.command()(results.report)
app.command("list")(results.list_)
data_app.command("path")(data.data_path)
data_app.command("list")(data.data_list)
data_app.command("check")(data.data_check)
data_app.command("fetch")(data.data_fetch)
app.command()(sweep.sweep)
app.command()(bench.bench)
app.command()(results.visualize)
app.command()(results.plot)


def _add_plugin_commands() -> None:
    """Task plugins' own ``lstmablate data ...`` subcommands: each entry point of the
    ``lstmablate.commands`` group names a ``register(data_app)`` function."""
    import warnings
    from importlib.metadata import entry_points

    for ep in entry_points(group="lstmablate.commands"):
        try:
            ep.load()(data_app)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the CLI down
            warnings.warn(f"data commands of plugin {ep.name!r} ({ep.value}) failed to load and "
                          f"were skipped: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


_add_plugin_commands()


def main(argv: list[str] | None = None) -> None:
    from ..threads import passive_waiting

    passive_waiting()  # before PyTorch loads OpenMP: idle threads sleep (lstmablate/threads.py)
    try:
        app(args=argv, standalone_mode=True)
    except UserError as e:
        # soft wrap: no line break inside a path or a suggested command (they stay copyable)
        err.print(f"[bold red]error:[/] {escape(e)}", soft_wrap=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, Interrupted):  # before training started (a training run
        # saves last.pt and exits cleanly)
        err.print("interrupted; no training step was lost (a run saves its progress once it has "
                  "started training, and `--resume` continues it).", soft_wrap=True)
        sys.exit(130)
    except OSError as e:  # the file system refused: read-only, full, a file where a directory goes
        where = f" ({e.filename})" if e.filename else ""
        err.print(f"[bold red]error:[/] the operating system refused a file operation"
                  f"{escape(where)}: {escape(e.strerror or e)}. Files already written were written "
                  "atomically and are intact; fix the cause and run the same command again.")
        sys.exit(2)
