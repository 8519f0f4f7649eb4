"""`lambdactl db upgrade`: apply the Alembic migrations shipped inside this package."""

from pathlib import Path

from alembic import command
from alembic.config import Config

from shared.db.connect import sqlalchemy_url


def alembic_config(postgres_url: str) -> Config:
    """Alembic's configuration for the migrations shipped here, against `postgres_url`."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(postgres_url))
    return config


def upgrade(postgres_url: str) -> None:
    command.upgrade(alembic_config(postgres_url), "head")
