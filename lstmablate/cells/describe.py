"""The rows of ``lstmablate list cells``: one per registered cell name.

The CLI prints them (with rich); this module only gathers facts from the
registry, so a plugin cell appears with no extra work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from lstmablate.errors import ConfigError

from .registry import CellSpec, available_cells, get_cell

#: the sizes of the "parameter count" column (the medium/large PTB width of
#: Zaremba et al. is 650; input = hidden as in a word LM)
TABLE_SIZE = 650


@dataclass(frozen=True)
class CellRow:
    name: str
    aliases: tuple[str, ...]
    family: str
    summary: str  # one-line equation summary
    equations: str  # where the equations come from
    params: int  # parameters of ONE layer, ONE direction at params_at
    params_at: tuple[int, int]  # (input_size, hidden_size) of the count
    bidirectional: bool  # may run right-to-left
    memory_cell: bool  # has the weighted-sum view (eq 8)
    proj_size: bool  # accepts the proj_size option
    fast_path: bool  # has a fused kernel for some options
    options: tuple[str, ...]  # options a user may set (the preset ones excluded)
    preset: dict  # the flag set this name fixes

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def supports(self) -> str:
        """Comma-separated capabilities, for a table's "supports" column."""
        flags = [("bidirectional", self.bidirectional), ("weighted-sum", self.memory_cell),
                 ("proj_size", self.proj_size), ("fast path", self.fast_path)]
        return ", ".join(f for f, on in flags if on) or "-"


def count_parameters(spec: CellSpec, input_size: int, hidden_size: int, **options) -> int:
    """Parameters of one layer, one direction (built on the meta device: no memory)."""
    with torch.device("meta"):
        cell = spec.build(input_size, hidden_size, **options)
    return sum(p.numel() for p in cell.parameters())


def _accepts_proj_size(spec: CellSpec) -> bool:
    if "proj_size" not in spec.option_names() - set(spec.preset):
        return False
    try:
        with torch.device("meta"):
            spec.build(4, 4, proj_size=2)
    except ConfigError:
        return False
    return True


def describe_cell(name: str, size: int = TABLE_SIZE) -> CellRow:
    spec = get_cell(name)
    try:
        params, at = count_parameters(spec, size, size), (size, size)
    except ConfigError:  # a cell that accepts only some sizes (dyck-rnn)
        at = tuple(getattr(spec.cls, "example_sizes", (2, 2)))
        params = count_parameters(spec, *at)
    return CellRow(
        name=spec.name,
        aliases=spec.aliases,
        family=spec.family,
        summary=spec.summary,
        equations=spec.equations,
        params=params,
        params_at=at,
        bidirectional=spec.bidirectional,
        memory_cell=spec.memory_cell,
        proj_size=_accepts_proj_size(spec),
        fast_path=spec.fast_path,
        options=tuple(sorted(spec.option_names() - set(spec.preset))),
        preset=dict(spec.preset),
    )


def cell_rows(size: int = TABLE_SIZE) -> list[CellRow]:
    """One :class:`CellRow` per registered cell name (aliases folded in), sorted by family then name."""
    rows = [describe_cell(n, size) for n in available_cells()]
    return sorted(rows, key=lambda r: (r.family, r.name))


def describe_cells(size: int = TABLE_SIZE) -> list[dict[str, str]]:
    """The `lstmablate list cells` table as display-ready rows (all values strings).

    Columns: name (aliases in parentheses), family, equations (one-line
    summary), params (one layer, one direction, at input = hidden = ``size``;
    cells that accept only some sizes say at which), supports, options.
    """
    table = []
    for r in cell_rows(size):
        name = r.name + (f" ({', '.join(r.aliases)})" if r.aliases else "")
        params = f"{r.params:,}"
        if r.params_at != (size, size):
            params += f" (at input {r.params_at[0]}, hidden {r.params_at[1]})"
        table.append({"name": name, "family": r.family, "equations": r.summary,
                      "params": params, "supports": r.supports,
                      "options": ", ".join(r.options) or "-"})
    return table
