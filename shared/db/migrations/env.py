"""Alembic environment: the URL comes from `shared.db.migrate.upgrade`, never from a file."""

from alembic import context
from sqlalchemy import create_engine

url = context.config.get_main_option("sqlalchemy.url")
if url is None:
    raise RuntimeError("run migrations with `lambdactl db upgrade`, which sets the URL")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
