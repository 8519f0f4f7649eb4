"""Runner bookkeeping: attempts and retry backoff, the runner that holds a run, timings and the
mode a run actually executed (an incremental run falls back to full when metric versions
changed).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE batch_runs
            ADD COLUMN attempt integer NOT NULL DEFAULT 1,
            ADD COLUMN retry_of bigint REFERENCES batch_runs (id),
            ADD COLUMN not_before timestamptz,
            ADD COLUMN runner text,
            ADD COLUMN executed_mode text,
            ADD COLUMN timings jsonb
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE batch_runs
            DROP COLUMN attempt, DROP COLUMN retry_of, DROP COLUMN not_before,
            DROP COLUMN runner, DROP COLUMN executed_mode, DROP COLUMN timings
        """
    )
