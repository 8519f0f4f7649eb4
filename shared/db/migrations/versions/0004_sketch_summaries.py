"""`batch_cells.distinct_estimates` becomes `sketch_summaries`: since quantile sketches share the
`sketches` column, the array beside it holds each sketch slot's stored summary (an HLL's
estimate; NULL for a KLL sketch, which is always read whole), not only distinct counts.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE batch_cells RENAME COLUMN distinct_estimates TO sketch_summaries")


def downgrade() -> None:
    op.execute("ALTER TABLE batch_cells RENAME COLUMN sketch_summaries TO distinct_estimates")
