"""The served row's history index: per partition, the smallest offset of the events of each
UTC day, over the whole history, so an incremental run that recomputes cells from a time
before W (a joined table changed, rule 11) starts reading near that time instead of at offset
0. NULL until a full run has built it (an incremental run cannot: it reads only new events).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE served_view ADD COLUMN history_index jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE served_view DROP COLUMN history_index")
