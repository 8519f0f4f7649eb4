"""Alembic environment: the URL comes from `shared.db.migrate.upgrade`, never from a file.
Each migration commits on its own, so the locks one takes (an ALTER TABLE of `served_view`)
are not held through a long one after it (0007 copies the served generation)."""

from alembic import context
from sqlalchemy import create_engine

url = context.config.get_main_option("sqlalchemy.url")
if url is None:
    raise RuntimeError("run migrations with `lambdactl db upgrade`, which sets the URL")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
