"""The task-agnostic training loop and what it needs: optimisers, schedules, checkpoints."""

from .trainer import Trainer, TrainResult

__all__ = ["Trainer", "TrainResult"]
