"""The batch layer's errors; each message says what happened and what to do."""

from __future__ import annotations

from shared.db.runs import RangeRefused
from shared.errors import CronError as CronError  # raised by shared.cron
from shared.errors import LambdaError


class BatchError(LambdaError):
    """Base class of the errors the batch layer raises on purpose; a run that raises one is
    marked failed with its message."""


class NotRetriable(BatchError):
    """A run that raises one fails without another attempt (the runner's retries, rule 7): the
    cause is the request or the configuration, which a retry would meet again."""


class RangeUnrunnable(NotRetriable, RangeRefused):
    """A range run met while the configuration holds a session metric: queued before it did
    (the queue refuses one since), it fails with the queue's reason rather than run full."""


class RunNotExecutable(BatchError):
    """The run cannot start (unknown, cancelled or already finished)."""


class PublicationConflict(BatchError):
    """The served row changed under an incremental or range run (another writer published):
    retry the run."""


class LogRewoundError(BatchError):
    """A partition ends before the served snapshot: the topic was recreated."""


class SnapshotUnavailableError(BatchError, TimeoutError):
    """A partition's last stable offset could not be read within the snapshot's patience."""


class ReadStalledError(BatchError, TimeoutError):
    """Reading a slice made no progress before its snapshot end."""


class UnpackablePositionError(BatchError, ValueError):
    """A record's (partition, offset) is past what the packed de-dup position holds."""
