"""TLS with real certificates (a throwaway CA made by `openssl`): the SSL context Faust gets
for Kafka verifies the broker and carries the client certificate, and a Redis server that
requires TLS and client certificates answers the clients the platform builds from
`redis.url` alone (a `redis-server` of its own, started here)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from confluent_kafka import Producer
from faust.auth import SASLCredentials, SSLCredentials
from pydantic import SecretStr

from shared.config import KafkaSettings, Settings
from shared.errors import ConfigError
from shared.kafka import client_config, faust_credentials

pytestmark = pytest.mark.timeout(60)

KEY_PASSWORD = "client-key-pa55"


@dataclass(frozen=True)
class Tls:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(name: str, cn: str, cwd: Path) -> None:
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={cn}",
        cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "1",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=lambda-test-ca",
        cwd=d,
    )
    _signed("server", "localhost", d)
    _signed("client", "lambda-client", d)
    _openssl(
        "pkey",
        "-in",
        "client.key",
        "-aes256",
        "-passout",
        f"pass:{KEY_PASSWORD}",
        "-out",
        "client-encrypted.key",
        cwd=d,
    )
    return Tls(
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "client-encrypted.key",
    )


def _sasl_ssl(tls: Tls) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="platform",
        sasl_password="sasl-pw",
        ssl_ca_location=str(tls.ca),
        ssl_certificate_location=str(tls.client_cert),
        ssl_key_location=str(tls.client_key_encrypted),
        ssl_key_password=KEY_PASSWORD,
    )


def test_ssl_becomes_a_verifying_faust_ssl_context(tls: Tls) -> None:
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_ca_location=str(tls.ca),
        ssl_certificate_location=str(tls.client_cert),
        ssl_key_location=str(tls.client_key),
    )
    credentials = faust_credentials(kafka)
    assert isinstance(credentials, SSLCredentials)
    assert credentials.protocol.value == "SSL"
    context = credentials.context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert any(
        c["subject"] == ((("commonName", "lambda-test-ca"),),) for c in context.get_ca_certs()
    )
    Producer(client_config(kafka))  # librdkafka loads the same files


def test_sasl_ssl_becomes_sasl_credentials_over_tls(tls: Tls) -> None:
    credentials = faust_credentials(_sasl_ssl(tls))
    assert isinstance(credentials, SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-256"
    assert (credentials.username, credentials.password) == ("platform", "sasl-pw")
    assert credentials.ssl_context is not None
    assert credentials.ssl_context.verify_mode == ssl.CERT_REQUIRED
    Producer(client_config(_sasl_ssl(tls)))  # the encrypted key opens with ssl_key_password


@pytest.mark.parametrize("password", [None, "wrong"])
def test_a_missing_or_wrong_key_password_fails_at_startup(tls: Tls, password: str | None) -> None:
    """Not at the first fetch, and never by OpenSSL prompting on the terminal."""
    kafka = _sasl_ssl(tls).model_copy(
        update={"ssl_key_password": None if password is None else SecretStr(password)}
    )
    with pytest.raises(ConfigError, match="LAMBDA_KAFKA__SSL_KEY_PASSWORD"):
        faust_credentials(kafka)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def tls_redis(tls: Tls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server that speaks only TLS and requires a client certificate."""
    server = shutil.which("redis-server")
    assert server is not None, "redis-server is part of the local stack"
    port = _free_port()
    process = subprocess.Popen(
        [
            server,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(tls.server_cert),
            "--tls-key-file",
            str(tls.server_key),
            "--tls-ca-cert-file",
            str(tls.ca),
            "--tls-auth-clients",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path_factory.mktemp("redis-tls")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _accepts(port):
            assert process.poll() is None and time.monotonic() < deadline, "redis-server TLS"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def test_redis_over_tls_from_the_url_alone(tls: Tls, tls_redis: int) -> None:
    url = (
        f"rediss://localhost:{tls_redis}/0?ssl_ca_certs={tls.ca}&ssl_certfile={tls.client_cert}"
        f"&ssl_keyfile={tls.client_key}&ssl_cert_reqs=required"
    )
    settings = Settings(redis={"url": url})
    client = redis.Redis.from_url(settings.redis.url, socket_timeout=5)
    assert client.set("tls", "yes") and client.get("tls") == b"yes"
    client.close()

    async def read() -> bytes | None:
        async_client = aioredis.Redis.from_url(settings.redis.url, socket_timeout=5)
        try:
            value: bytes | None = await async_client.get("tls")
            return value
        finally:
            await async_client.aclose()

    assert asyncio.run(read()) == b"yes"
    without_client_cert = url.split("&ssl_certfile")[0]
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(without_client_cert, socket_timeout=5).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(
            url.replace(f"={tls.ca}", "=/etc/ssl/certs/ca-certificates.crt"), socket_timeout=5
        ).ping()
