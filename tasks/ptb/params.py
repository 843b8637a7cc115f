"""Parameter counts of a PTB recipe's runs, from the models themselves (no data is read):

    python -m lstmablate_tasks.ptb.params RECIPE [RECIPE ...]

prints ``experiment, cell, hidden size, layers, parameters`` per run (the second-order
report's recipes state their budgets from it)."""

from __future__ import annotations

import functools
import sys

from .task import PTB_VOCAB_SIZES, PTBModel, PTBTask, build_language_model


def count_parameters(cell: str, model_cfg: PTBModel, level: str) -> int:
    """Trainable parameters of the language model of ``model_cfg`` with ``cell`` over PTB's
    vocabulary at ``level`` (10,000 words / 50 characters, ``<eos>`` included); builds the
    model, reads no data."""
    from lstmablate.cells import build_encoder

    make = functools.partial(build_encoder, cell)
    model = build_language_model(make, PTB_VOCAB_SIZES[level], model_cfg)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def recipe_parameter_counts(recipe: str) -> list[tuple[str, str, int, int, int]]:
    """``(experiment, cell, hidden_size, num_layers, parameters)`` of every run of a PTB recipe
    (its grid points and cells, each with its cell_overrides); reads no data."""
    from lstmablate.recipes import grid_points, load_recipe, resolve_config

    name, r = load_recipe(recipe)
    rows = []
    for experiment, overrides, _ in grid_points(name, r):
        for cell in r.get("cells") or []:
            cfg = resolve_config(PTBTask, cell, recipe=recipe, overrides=overrides)
            rows.append((experiment, cell, cfg.model.hidden_size, cfg.model.num_layers,
                         count_parameters(cell, cfg.model, cfg.data.level)))
    return rows


def main(argv: list[str]) -> None:
    for recipe in argv:
        for row in recipe_parameter_counts(recipe):
            print("{}\t{}\th={}\tlayers={}\t{:,}".format(*row))


if __name__ == "__main__":
    main(sys.argv[1:])
