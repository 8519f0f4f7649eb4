"""The speed layer's errors; each message says what happens next and what to do."""

from __future__ import annotations

from shared.errors import LambdaError


class SpeedError(LambdaError):
    """Base class of the errors the speed layer raises on purpose."""


class SideTopicError(SpeedError):
    """Dead letters or late events could not be published: the batch holding them is not
    applied, and is read again from the partition's fence after a backoff."""


class ServedRowUnavailable(SpeedError):
    """A partition with no fence is read from `rebuild_from`, which only the served row in
    PostgreSQL knows, and PostgreSQL has not answered since the worker started: the partition
    is positioned once it does."""
