"""The central cell registry: a name -> CellSpec dict, filled by a decorator.

    @register_cell("lstm-srnn", family="lstm", summary="c~_t = W_cx x_t", content="linear")
    class LSTMFamilyCell(Cell): ...

A class may be registered several times under different names with different
preset options — that is how the LSTM ablations are "named flag sets" of one
implementation.  Cells from other distributions are found through the
``lstmablate.cells`` entry-point group: each entry point names a module (or a
callable) whose import registers its cells, loaded on the first lookup.  Nothing
else is magic.

This module is a leaf: it imports no cell.  The built-in families register
themselves when ``lstmablate.cells`` is imported (the list is ``builtin.py``);
building an encoder of a registered name is ``build.py``.
"""

from __future__ import annotations

import inspect
import math
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from lstmablate.errors import ConfigError, UnknownNameError
from lstmablate.limits import described, fits

from .base import Cell

ENTRY_POINT_GROUP = "lstmablate.cells"


@dataclass(frozen=True)
class CellSpec:
    """Everything the toolkit knows about a registered cell name."""

    name: str
    cls: type[Cell]
    family: str
    summary: str  # one-line equation summary for `lstmablate list cells`
    preset: dict[str, Any] = field(default_factory=dict)  # the flag set
    bidirectional: bool = True  # may run right-to-left
    equations: str = ""  # where the equations come from
    aliases: tuple[str, ...] = ()

    def build(self, input_size: int, hidden_size: int, **options: Any) -> Cell:
        self.check_options(options)
        cell = self.cls(input_size, hidden_size, **self.preset, **options)
        cell.cell_name = self.name  # what the record of the kernel paths calls it
        return cell

    def option_names(self) -> set[str]:
        params = inspect.signature(self.cls.__init__).parameters
        return {p for p in params if p not in ("self", "input_size", "hidden_size")}

    def check_options(self, options: dict[str, Any], where: str = "") -> None:
        """ConfigError unless ``options`` (e.g. a run's ``model.cell_options``: ``where``, which
        prefixes the names in messages) are options this cell takes: declared by its class, not
        fixed by its flag set, each value of the type its class declares and within
        :attr:`Cell.option_ranges`.  Checked when a run's config is resolved, before any data
        is read, and again by :meth:`build`."""
        def named(key: str) -> str:
            return f"{where}.{key}" if where else key

        clash = set(options) & set(self.preset)
        if clash:
            raise ConfigError(
                f"cell {self.name!r} fixes option(s) {', '.join(named(k) for k in sorted(clash))} "
                f"(its flag set is {self.preset}); choose another cell name instead."
            )
        allowed = self.option_names()
        unknown = [k for k in options if k not in allowed]
        if unknown:
            raise UnknownNameError(f"option of cell {self.name!r}", named(str(unknown[0])),
                                   [named(k) for k in sorted(allowed - set(self.preset))])
        try:
            hints = typing.get_type_hints(self.cls.__init__)
        except (NameError, TypeError):  # a plugin's annotations that do not resolve: unchecked
            hints = {}
        for key, value in options.items():
            tp = hints.get(key, Any)
            low, high = self.cls.option_ranges.get(key, (-math.inf, math.inf))
            if not fits(value, tp) or (fits(value, float) and not low <= value <= high):
                bounds = f" in [{low:g}, {high:g}]" if math.isfinite(high) else ""
                raise ConfigError(f"{named(key)}: cell {self.name!r} takes {described(tp)}"
                                  f"{bounds}, got {value!r}{_as_text(value)}.")
            choices = self.cls.option_choices.get(key)
            if choices is not None and value is not None and value not in choices:
                raise ConfigError(f"{named(key)}: cell {self.name!r} takes one of "
                                  f"{', '.join(map(str, choices))}, got {value!r}.")

    def build_example(self) -> Cell:
        """A cell at the class's ``example_sizes`` (for introspection only)."""
        return self.build(*getattr(self.cls, "example_sizes", (2, 2)))

    @property
    def memory_cell(self) -> bool:
        return self.build_example().has_memory_cell

    @property
    def fast_path(self) -> bool:
        return bool(getattr(self.cls, "fast_path_available", lambda cell: False)(self.build_example()))


def _as_text(value: Any) -> str:
    """For a number YAML read as text (YAML 1.1 reads ``1e-5``, without a dot, as a string)."""
    if not isinstance(value, str):
        return ""
    try:
        float(value)
    except ValueError:
        return ""
    return f" (YAML reads {value} as text; write it with a dot, e.g. 1.0e-5)"


_REGISTRY: dict[str, CellSpec] = {}
_ALIASES: dict[str, str] = {}
_plugins_loaded = False


def register_cell(
    name: str,
    *,
    family: str,
    summary: str,
    equations: str = "",
    bidirectional: bool = True,
    aliases: tuple[str, ...] = (),
    **preset: Any,
) -> Callable[[type[Cell]], type[Cell]]:
    """Class decorator adding ``name`` (with a preset flag set) to the registry."""

    def decorate(cls: type[Cell]) -> type[Cell]:
        if not (isinstance(cls, type) and issubclass(cls, Cell)):
            raise TypeError(f"register_cell({name!r}) expects a Cell subclass, got {cls!r}")
        for n in (name, *aliases):
            if n in _REGISTRY or n in _ALIASES:
                raise ValueError(f"cell name {n!r} is already registered")
        _REGISTRY[name] = CellSpec(name, cls, family, summary, dict(preset),
                                   bidirectional, equations, tuple(aliases))
        for a in aliases:
            _ALIASES[a] = name
        return cls

    return decorate


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.module.startswith("lstmablate.cells"):
            continue
        # A broken third-party plugin must not take the built-in cells down
        # with it: warn, naming the entry point, and carry on.
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except Exception as err:  # noqa: BLE001
            warnings.warn(
                f"cell plugin {ep.name!r} ({ep.value}, entry point group "
                f"{ENTRY_POINT_GROUP!r}) failed to load and was skipped: "
                f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)


def available_cells() -> list[str]:
    """All registered cell names (not aliases), sorted."""
    _load_plugins()
    return sorted(_REGISTRY)


def get_cell(name: str) -> CellSpec:
    _load_plugins()
    name = _ALIASES.get(name, name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError(
            "cell", name, list(_REGISTRY) + list(_ALIASES),
            hint="Run `lstmablate list cells` for details.") from None
