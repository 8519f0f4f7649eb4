"""Kafka helpers used by more than one layer: topic administration and client settings.

Every client the platform builds reaches the cluster the way `KafkaSettings` says (TLS, SASL),
through one translation per client library: `client_config` for confluent-kafka (librdkafka),
`faust_credentials` for Faust (aiokafka), `reader_options`/`client_config_of_options` for the
batch layer's Spark data source, whose options cross to the Python workers as strings."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from pydantic import SecretStr

from shared.config import KafkaSettings, Settings
from shared.errors import ConfigError, ServiceUnavailableError, TopicMismatchError

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

_READER_OPTION_PREFIX = "kafka."


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    required: Mapping[str, str] = field(default_factory=dict)
    """Topic configs the platform's rules rely on: checked on a live topic, and set on an
    existing one by `create_topics`."""


ARRIVAL_CLOCK = {"message.timestamp.type": "LogAppendTime"}
"""A source topic stamps each record with the broker's clock as it appends it, so the one
clock both layers bound event times by (`max_future`, and stream time, rules 1 and 2) is
read from the log and cannot run ahead with a producer's."""


def platform_topics(settings: Settings) -> list[TopicSpec]:
    """Source and table topics keep their history forever (the master dataset, rule 11 for
    tables); `.dlq`/`.late` too. Source topics take the broker's clock (`ARRIVAL_CLOCK`)."""
    forever = {"retention.ms": "-1"}
    specs = []
    for source in settings.sources:
        specs.append(
            TopicSpec(source.topic, source.partitions, forever | ARRIVAL_CLOCK, ARRIVAL_CLOCK)
        )
        specs.append(TopicSpec(source.dlq_topic, source.partitions, forever))
        specs.append(TopicSpec(source.late_topic, source.partitions, forever))
    for table in settings.tables:
        specs.append(TopicSpec(table.topic, table.partitions, forever))
        specs.append(TopicSpec(table.dlq_topic, table.partitions, forever))
    return specs


def client_config(kafka: KafkaSettings) -> dict[str, str]:
    """The confluent-kafka (librdkafka) settings that reach the cluster: the bootstrap
    servers and, when configured, TLS and SASL. Each client adds its own tuning to it."""
    config = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol,
    }
    optional = {
        "sasl.mechanism": kafka.sasl_mechanism,
        "sasl.username": kafka.sasl_username,
        "sasl.password": _revealed(kafka.sasl_password),
        "ssl.ca.location": kafka.ssl_ca_location,
        "ssl.certificate.location": kafka.ssl_certificate_location,
        "ssl.key.location": kafka.ssl_key_location,
        "ssl.key.password": _revealed(kafka.ssl_key_password),
    }
    config.update({key: value for key, value in optional.items() if value is not None})
    return config


def faust_credentials(kafka: KafkaSettings) -> CredentialsT | None:
    """Faust's `broker_credentials` for the same settings (aiokafka under it takes an
    `ssl.SSLContext`, not file names); None for PLAINTEXT. The context verifies the broker's
    certificate and host name, as librdkafka does. An encrypted key without its password
    fails here: OpenSSL would otherwise ask for it on the terminal."""
    from aiokafka.helpers import create_ssl_context
    from faust.auth import SASLCredentials, SSLCredentials

    context = None
    if kafka.security_protocol.endswith("SSL"):
        try:
            context = create_ssl_context(
                cafile=kafka.ssl_ca_location,
                certfile=kafka.ssl_certificate_location,
                keyfile=kafka.ssl_key_location,
                password=_revealed(kafka.ssl_key_password) or "",
            )
        except OSError as exc:  # ssl.SSLError included
            raise ConfigError(
                f"the Kafka TLS files could not be loaded ({exc}); check "
                "LAMBDA_KAFKA__SSL_CA_LOCATION, LAMBDA_KAFKA__SSL_CERTIFICATE_LOCATION, "
                "LAMBDA_KAFKA__SSL_KEY_LOCATION and LAMBDA_KAFKA__SSL_KEY_PASSWORD"
            ) from exc
    if kafka.security_protocol.startswith("SASL_"):
        return SASLCredentials(
            username=kafka.sasl_username,
            password=_revealed(kafka.sasl_password),
            mechanism=kafka.sasl_mechanism,
            ssl_context=context,
        )
    return None if context is None else SSLCredentials(context)


def _revealed(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def reader_options(kafka: KafkaSettings) -> dict[str, str]:
    """`client_config` as options of the batch layer's Spark data source (`kafka.<key>`,
    like Spark's own Kafka source). Spark redacts the values of options named like a
    password in its UI and logs."""
    return {_READER_OPTION_PREFIX + key: value for key, value in client_config(kafka).items()}


def client_config_of_options(options: Mapping[str, str]) -> dict[str, str]:
    """The client settings `reader_options` put among a data source's options."""
    return {
        key.removeprefix(_READER_OPTION_PREFIX): value
        for key, value in options.items()
        if key.startswith(_READER_OPTION_PREFIX)
    }


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient({**client_config(settings.kafka)})


def live_partition_counts(admin: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceUnavailableError(
            f"Kafka is not reachable ({exc}); start it with `lambdactl stack up` or set "
            "LAMBDA_KAFKA__BOOTSTRAP_SERVERS"
        ) from exc
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def create_topics(settings: Settings) -> list[str]:
    """Create the missing platform topics and set the required configs of existing ones
    (`TopicSpec.required`); returns the names created. Then checks them all."""
    admin = admin_client(settings)
    live = live_partition_counts(admin)
    specs = platform_topics(settings)
    _set_required(admin, [s for s in specs if s.name in live and s.required])
    missing = [spec for spec in specs if spec.name not in live]
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions, config=s.config) for s in missing]
        )
        for future in futures.values():
            try:
                future.result()
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        _wait_for_leaders(admin, [spec.name for spec in missing])
    check_topics(settings)
    return [spec.name for spec in missing]


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout_s: float = 30.0) -> None:
    """A created topic is usable once every partition has a leader: the controller answers
    the create before the brokers' metadata shows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10).topics
        waiting = [
            name
            for name in topics
            if name not in metadata
            or metadata[name].error is not None
            or any(p.leader < 0 for p in metadata[name].partitions.values())
        ]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"topics {waiting} were created but have no leader after {timeout_s:.0f} s; "
                "check the brokers (`lambdactl stack status`, the broker log)"
            )
        time.sleep(0.1)


def _required_drift(admin: AdminClient, specs: list[TopicSpec]) -> dict[str, dict[str, str]]:
    """Per topic of `specs`, the required configs whose live value differs: name -> live."""
    if not specs:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, spec.name) for spec in specs]
    drift: dict[str, dict[str, str]] = {}
    try:
        answers = admin.describe_configs(resources, request_timeout=10)
        for spec, resource in zip(specs, resources, strict=True):
            live = answers[resource].result()
            differ = {
                key: live[key].value
                for key, wanted in spec.required.items()
                if key in live and live[key].value != wanted
            }
            if differ:
                drift[spec.name] = differ
    except KafkaException as exc:
        raise ServiceUnavailableError(
            f"Kafka did not describe the topics' configs ({exc}); check the brokers"
        ) from exc
    return drift


def _set_required(admin: AdminClient, specs: list[TopicSpec]) -> None:
    """Set each existing topic's required configs that differ (an incremental alter: other
    configs stay as they are)."""
    drift = _required_drift(admin, specs)
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            spec.name,
            incremental_configs=[
                ConfigEntry(key, spec.required[key], incremental_operation=AlterConfigOpType.SET)
                for key in drift[spec.name]
            ],
        )
        for spec in specs
        if spec.name in drift
    ]
    if resources:
        for future in admin.incremental_alter_configs(resources).values():
            future.result()


def check_topics(settings: Settings) -> None:
    """Refuse to run when a live topic's partition count differs from the config, or a
    config the rules rely on (`TopicSpec.required`) is not set."""
    admin = admin_client(settings)
    live = live_partition_counts(admin)
    specs = platform_topics(settings)
    problems = []
    for spec in specs:
        count = live.get(spec.name)
        if count is None:
            problems.append(f"topic {spec.name!r} does not exist (run `lambdactl topics create`)")
        elif count != spec.partitions:
            problems.append(
                f"topic {spec.name!r} has {count} partitions but the config says "
                f"{spec.partitions}; fix `partitions` in the config or recreate the topic"
            )
    checked = [s for s in specs if s.name in live and s.required]
    drift = _required_drift(admin, checked)
    for spec in checked:
        for key, value in drift.get(spec.name, {}).items():
            problems.append(
                f"topic {spec.name!r} has {key}={value}, but the platform bounds event times "
                "by the broker's clock (rule 1 in docs/semantics.md); run `lambdactl topics "
                f"create`, which sets {key}={spec.required[key]}"
            )
    if problems:
        raise TopicMismatchError("; ".join(problems))
