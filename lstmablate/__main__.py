"""``python -m lstmablate`` (also what torchrun launches)."""

from .cli import main

main()
