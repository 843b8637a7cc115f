"""Package discovery (everything else is in pyproject.toml).

``tasks/`` installs as ``lstmablate_tasks`` and ``recipes/`` as
``lstmablate_recipes``; every folder under ``lstmablate/`` and ``tasks/`` that has
an ``__init__.py`` is a package, so a new task folder needs no edit here (only
its entry point in pyproject.toml).
"""

from setuptools import find_packages, setup

setup(
    package_dir={"lstmablate": "lstmablate", "lstmablate_tasks": "tasks",
                 "lstmablate_recipes": "recipes"},
    packages=(["lstmablate"] + [f"lstmablate.{p}" for p in find_packages("lstmablate")]
              + ["lstmablate_tasks"] + [f"lstmablate_tasks.{p}" for p in find_packages("tasks")]
              + ["lstmablate_recipes"]),
)
