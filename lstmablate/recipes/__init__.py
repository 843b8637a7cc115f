"""Recipes: YAML files that name a task's configuration, the cells and seeds of a sweep, the
paper's numbers, a grid, or a table of several recipes — and the resolution of a run's
config from them.

Resolution order (later wins):

1. the task's dataclass defaults (the original system's hyperparameters) and its
   ``train_defaults``;
2. the recipe (``--recipe``): its sections ``data``, ``model``, ``train``, ``eval``, then
   the ``cell_overrides`` of the run's cell;
3. ``--set section.key=value`` overrides from the command line.

The package's modules, whose names ``lstmablate.recipes`` hands on (the import path every
command, plugin and test uses): :mod:`.load` finds and reads a recipe with its ``base:``
chain and ``overlay:`` (inheritance, and ``list recipes --resolved``); :mod:`.check` holds
what each key of a recipe must be and the check of the names it holds; :mod:`.expand` turns
a recipe into what it runs (its grid's experiments, each cell's seeds, a run's config, the
tables of ``make reproduce-NAME``).  The format is documented in docs/recipes.md.
"""

from .check import (MERGED, OVERLAY_KEYS, RECIPE_KEYS, RECIPE_SHAPES, TABLE_KEYS, TABLE_SHAPES,
                    check_recipe, check_recipe_names, check_shapes)
from .expand import grid_points, recipe_seeds, report_tables, resolve_config
from .load import (MERGE_DEPTH, NOT_INHERITED, OVERLAY_DIR, Layer, available_overlays,
                   available_recipes, explain_recipe, find_recipe, load_recipe, load_yaml,
                   looks_like_path, recipe_chain, recipe_dirs)

__all__ = [
    "MERGED", "MERGE_DEPTH", "NOT_INHERITED", "OVERLAY_DIR", "OVERLAY_KEYS", "RECIPE_KEYS",
    "RECIPE_SHAPES", "TABLE_KEYS", "TABLE_SHAPES", "Layer", "available_overlays",
    "available_recipes", "check_recipe", "check_recipe_names", "check_shapes", "explain_recipe",
    "find_recipe", "grid_points", "load_recipe", "load_yaml", "looks_like_path", "recipe_chain",
    "recipe_dirs", "recipe_seeds", "report_tables", "resolve_config",
]
