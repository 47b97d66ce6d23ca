"""Stand-in of verl.checkpoint_engine at verl-project/verl 1dda039b9 (see ../../README.md)."""

from .base import CheckpointEngine, CheckpointEngineRegistry

__all__ = ["CheckpointEngine", "CheckpointEngineRegistry"]
