"""Speed layer: Faust workers keeping real-time event-time cells in Redis, exactly once."""

from speed_layer.app import run_worker

__all__ = ["run_worker"]
