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


class TableFeedError(SpeedError):
    """A joined table could not be read up to its end (rule 11): the batch is not applied, and
    is read again after a backoff, so no event joins a table older than what it should see."""
