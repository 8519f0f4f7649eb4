"""The served row's rebuild index: per partition, the smallest offset of the events in each
time bucket at or after W, so an incremental run finds the next `rebuild_from` from the new
events and this index instead of re-reading every event after the previous W.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE served_view ADD COLUMN rebuild_index jsonb NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    op.execute("ALTER TABLE served_view DROP COLUMN rebuild_index")
