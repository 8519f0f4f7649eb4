"""Security rules as pure logic: tokens compared in constant time against every configured
token, secrets absent from every rendering of the settings, the open-API refusal outside the
local profile, and the client settings TLS/SASL become for confluent-kafka, Faust and the
Spark reader, Redis and PostgreSQL. (`tests/unit/test_security_tls.py` checks the TLS
material itself; `tests/serving/test_security.py` the running API.)"""

from __future__ import annotations

import hmac
from pathlib import Path

import psycopg
import pytest
import redis
import redis.asyncio as aioredis
from confluent_kafka import Producer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from serving_layer import auth
from shared.config import AuthSettings, KafkaSettings, Settings, load_settings
from shared.db.connect import sqlalchemy_url
from shared.errors import ConfigError
from shared.kafka import client_config, client_config_of_options, faust_credentials, reader_options

READERS = ("reader-secret-1", "reader-secret-2")
OPERATORS = ("operator-secret-1", "operator-secret-2", "operator-secret-3")
SASL_PASSWORD = "sasl-pa55word-xyz"
KEY_PASSWORD = "key-pa55word-xyz"


@pytest.fixture
def compare_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    return calls


@pytest.mark.parametrize(
    ("token", "role"),
    [
        (OPERATORS[0], "operator"),
        (OPERATORS[2], "operator"),
        (READERS[0], "reader"),
        (READERS[1], "reader"),
        ("unknown", None),
        ("x" * 500, None),
    ],
)
def test_every_token_is_compared_in_constant_time(
    compare_calls: list[tuple[bytes, bytes]], token: str, role: str | None
) -> None:
    settings = AuthSettings(reader_tokens=READERS, operator_tokens=OPERATORS)
    assert auth.role_of(settings, token) == role
    assert len(compare_calls) == len(READERS) + len(OPERATORS), "no early exit on a match"
    assert {len(a) for pair in compare_calls for a in pair} == {32}, (
        "digests of one length: the time tells nothing of the tokens' lengths"
    )


def _with_secrets() -> Settings:
    return Settings(
        auth=AuthSettings(reader_tokens=READERS, operator_tokens=OPERATORS),
        kafka=KafkaSettings(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="platform",
            sasl_password=SASL_PASSWORD,
            ssl_certificate_location="/etc/lambda/client.pem",
            ssl_key_location="/etc/lambda/client.key",
            ssl_key_password=KEY_PASSWORD,
        ),
    )


SECRETS = (*READERS, *OPERATORS, SASL_PASSWORD, KEY_PASSWORD)


def test_secrets_appear_in_no_rendering_of_the_settings() -> None:
    settings = _with_secrets()
    sasl_only = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="platform",
        sasl_password=SASL_PASSWORD,
    )
    renderings = [
        repr(settings),
        str(settings),
        repr(settings.auth),
        repr(settings.kafka),
        settings.model_dump_json(),
        str(settings.model_dump()),
        repr(faust_credentials(sasl_only)),
    ]
    for text in renderings:
        assert not [s for s in SECRETS if s in text], text


def test_configuration_errors_do_not_show_secrets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LAMBDA_CONFIG", str(tmp_path / "lambda.yaml"))
    (tmp_path / "lambda.yaml").write_text("serving: {port: not-a-port}\n")
    monkeypatch.setenv("LAMBDA_AUTH__READER_TOKENS", ",".join(READERS))
    monkeypatch.setenv("LAMBDA_AUTH__OPERATOR_TOKENS", "[1, 2]")  # not text: invalid
    monkeypatch.setenv("LAMBDA_KAFKA__SASL_PASSWORD", SASL_PASSWORD)  # PLAINTEXT: invalid
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "serving.port" in message and "sasl_password" in message
    assert "auth.operator_tokens" in message
    assert not [s for s in SECRETS if s in message], message


def test_outside_the_local_profile_the_api_needs_tokens_or_an_explicit_open() -> None:
    auth.check_open_access(Settings())
    with pytest.raises(ConfigError) as caught:
        auth.check_open_access(Settings(profile="production"))
    for name in ("LAMBDA_AUTH__READER_TOKENS", "LAMBDA_AUTH__OPERATOR_TOKENS"):
        assert name in str(caught.value)
    assert "LAMBDA_AUTH__ALLOW_OPEN=true" in str(caught.value)
    auth.check_open_access(Settings(profile="production", auth=AuthSettings(allow_open=True)))
    auth.check_open_access(
        Settings(profile="production", auth=AuthSettings(operator_tokens=OPERATORS))
    )


def test_plaintext_is_the_default_client_config() -> None:
    assert client_config(KafkaSettings(bootstrap_servers="b1:9092,b2:9092")) == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert faust_credentials(KafkaSettings()) is None


def test_sasl_ssl_client_config_for_confluent_kafka_and_spark() -> None:
    kafka = _with_secrets().kafka
    expected = {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "platform",
        "sasl.password": SASL_PASSWORD,
        "ssl.certificate.location": "/etc/lambda/client.pem",
        "ssl.key.location": "/etc/lambda/client.key",
        "ssl.key.password": KEY_PASSWORD,
    }
    assert client_config(kafka) == expected
    options = reader_options(kafka)
    assert all(key.startswith("kafka.") for key in options)
    assert client_config_of_options({**options, "source": "{}", "slices": "[]"}) == expected


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
def test_librdkafka_accepts_every_protocol_config(protocol: str) -> None:
    """librdkafka checks names and values when a client is built (no connection is made)."""
    sasl = protocol.startswith("SASL_")
    kafka = KafkaSettings(
        bootstrap_servers="127.0.0.1:1",
        security_protocol=protocol,
        sasl_mechanism="SCRAM-SHA-256" if sasl else None,
        sasl_username="u" if sasl else None,
        sasl_password="p" if sasl else None,
    )
    Producer(client_config(kafka))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_becomes_faust_credentials(mechanism: str) -> None:
    kafka = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_username="platform",
        sasl_password=SASL_PASSWORD,
    )
    aiokafka = credentials_to_aiokafka_auth(faust_credentials(kafka))
    assert aiokafka == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "platform",
        "sasl_plain_password": SASL_PASSWORD,
        "ssl_context": None,
    }


def test_incomplete_or_unused_kafka_security_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="LAMBDA_KAFKA__SASL_PASSWORD"):
        load_settings(kafka={"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"})
    with pytest.raises(ConfigError, match="LAMBDA_KAFKA__SECURITY_PROTOCOL"):
        load_settings(kafka={"ssl_ca_location": "/etc/lambda/ca.pem"})
    with pytest.raises(ConfigError, match="set both or neither"):
        load_settings(kafka={"security_protocol": "SSL", "ssl_key_location": "/k.pem"})


REDIS_TLS = (
    "rediss://:pw@redis.internal:6380/3?ssl_ca_certs=/etc/lambda/redis-ca.pem"
    "&ssl_certfile=/etc/lambda/redis-client.pem&ssl_keyfile=/etc/lambda/redis-client.key"
    "&ssl_cert_reqs=required"
)


@pytest.mark.parametrize("client_class", [redis.Redis, aioredis.Redis])
def test_redis_tls_settings_reach_the_clients(client_class: type) -> None:
    """Every Redis client is `from_url(settings.redis.url)`: redis-py hands the URL's TLS
    parameters to its TLS connection class."""
    pool = client_class.from_url(Settings(redis={"url": REDIS_TLS}).redis.url).connection_pool
    assert "SSL" in pool.connection_class.__name__
    kwargs = pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == "/etc/lambda/redis-ca.pem"
    assert kwargs["ssl_certfile"] == "/etc/lambda/redis-client.pem"
    assert kwargs["ssl_keyfile"] == "/etc/lambda/redis-client.key"
    assert kwargs["ssl_cert_reqs"] == "required"
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("redis.internal", 6380, 3)


def test_postgres_tls_settings_reach_libpq_and_alembic() -> None:
    url = (
        "postgresql://lambda:pw@pg.internal:5432/lambda?sslmode=verify-full"
        "&sslrootcert=/etc/lambda/pg-ca.pem&sslcert=/etc/lambda/pg.pem&sslkey=/etc/lambda/pg.key"
    )
    params = psycopg.conninfo.conninfo_to_dict(Settings(postgres={"url": url}).postgres.url)
    assert params["sslmode"] == "verify-full"
    assert params["sslrootcert"] == "/etc/lambda/pg-ca.pem"
    assert (params["sslcert"], params["sslkey"]) == ("/etc/lambda/pg.pem", "/etc/lambda/pg.key")
    assert sqlalchemy_url(url).endswith(url.partition("://")[2])
