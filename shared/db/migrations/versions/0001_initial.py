"""The batch view partitioned by generation, the served row, the id table and the run log.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE batch_cells (
            generation bigint NOT NULL,
            metric text NOT NULL,
            version text NOT NULL,
            window_ms bigint NOT NULL,
            start_ms bigint NOT NULL,
            key text[] NOT NULL,
            count bigint NOT NULL,
            sum double precision NOT NULL,
            min double precision,
            max double precision,
            sketches bytea[] NOT NULL,
            distinct_estimates double precision[] NOT NULL,
            PRIMARY KEY (generation, metric, version, window_ms, start_ms, key)
        ) PARTITION BY LIST (generation)
        """
    )
    op.execute(
        """
        CREATE TABLE served_view (
            id integer PRIMARY KEY CONSTRAINT served_view_single_row CHECK (id = 1),
            generation bigint NOT NULL,
            snapshot jsonb NOT NULL,
            watermarks jsonb NOT NULL,
            rebuild_from jsonb NOT NULL,
            versions jsonb NOT NULL,
            published_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE dedup_ids (
            source text NOT NULL,
            event_id text NOT NULL,
            partition integer NOT NULL,
            "offset" bigint NOT NULL,
            PRIMARY KEY (source, event_id)
        )
        """
    )
    op.execute("CREATE SEQUENCE batch_generation_seq START 1")
    op.execute(
        """
        CREATE TABLE batch_runs (
            id bigserial PRIMARY KEY,
            mode text NOT NULL CONSTRAINT batch_runs_mode
                CHECK (mode IN ('incremental', 'full', 'range')),
            range_start_ms bigint,
            range_end_ms bigint,
            status text NOT NULL CONSTRAINT batch_runs_status
                CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
            progress real NOT NULL DEFAULT 0,
            requested_at timestamptz NOT NULL DEFAULT now(),
            started_at timestamptz,
            finished_at timestamptz,
            heartbeat_at timestamptz,
            rows_in bigint,
            rows_out bigint,
            malformed bigint,
            skipped jsonb,
            snapshot jsonb,
            w_before jsonb,
            w_after jsonb,
            generation bigint,
            error text
        )
        """
    )
    op.execute("CREATE INDEX batch_runs_status_idx ON batch_runs (status, id)")


def downgrade() -> None:
    for table in ("batch_runs", "dedup_ids", "served_view", "batch_cells"):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    op.execute("DROP SEQUENCE IF EXISTS batch_generation_seq")
