"""The runner's schedule (`batch.schedule`); parsed by `shared.cron`, where the settings
validate it at load."""

from shared.cron import Schedule

__all__ = ["Schedule"]
