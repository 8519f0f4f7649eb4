"""The root of the platform's exceptions; every message tells the operator what to do."""


class LambdaError(Exception):
    """Base class for errors the platform raises on purpose."""


class ConfigError(LambdaError):
    """The configuration is invalid; the message names the field and what is allowed."""


class CronError(ConfigError, ValueError):
    """A `batch.schedule` that is neither 'hourly' nor a valid 5-field cron expression; a
    ValueError too, so the settings report it as an error of that field."""


class TopicMismatchError(LambdaError):
    """A live topic disagrees with the configuration (e.g. its partition count)."""


class ServiceUnavailableError(LambdaError):
    """A backing service (Kafka, Redis, PostgreSQL) cannot be reached."""
