"""A run's count of ids read at more than one event time (rule 4 in docs/semantics.md: each
use of a reused id is its own event, and this says how often producers reuse them).

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE batch_runs ADD COLUMN reused_ids bigint")


def downgrade() -> None:
    op.execute("ALTER TABLE batch_runs DROP COLUMN reused_ids")
