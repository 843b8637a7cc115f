"""Recipes (YAML) shipped with lstmablate; installed as ``lstmablate_recipes``."""
