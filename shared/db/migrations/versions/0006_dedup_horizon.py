"""The de-dup horizon (rule 4 in docs/semantics.md): the ids of sources with a
`dedup_horizon`, per partition and partitioned by event time (one table per UTC day, created
as ids arrive), so forgetting ids past the horizon drops whole tables; and the served row's
stream time per partition at its snapshot, from which an incremental run judges its new
events against the horizon.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE served_view ADD COLUMN stream_times jsonb NOT NULL DEFAULT '{}'")
    op.execute(
        """
        CREATE TABLE horizon_ids (
            source text NOT NULL,
            partition integer NOT NULL,
            event_id text NOT NULL,
            "offset" bigint NOT NULL,
            time_ms bigint NOT NULL,
            PRIMARY KEY (source, partition, event_id, time_ms)
        ) PARTITION BY RANGE (time_ms)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE horizon_ids")
    op.execute("ALTER TABLE served_view DROP COLUMN stream_times")
