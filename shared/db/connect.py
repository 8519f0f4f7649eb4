"""Connections to PostgreSQL: psycopg for the hot paths, SQLAlchemy for migrations."""

import psycopg


def sqlalchemy_url(postgres_url: str) -> str:
    """SQLAlchemy's spelling of a `postgresql://` URL with the psycopg 3 driver."""
    scheme, _, rest = postgres_url.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else postgres_url


def connect(postgres_url: str, *, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(postgres_url, autocommit=autocommit, connect_timeout=5)
