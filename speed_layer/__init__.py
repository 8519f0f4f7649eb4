"""Speed layer: Faust workers keeping real-time event-time cells in Redis, exactly once.

Public surface: `run_worker`; its errors derive from `SpeedError` (`speed_layer.errors`)."""

from speed_layer.app import run_worker
from speed_layer.errors import SpeedError

__all__ = ["SpeedError", "run_worker"]
