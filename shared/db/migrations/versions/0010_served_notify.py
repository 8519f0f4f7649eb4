"""Every write of the served row announced (issue #50): a statement trigger on `served_view`
sends `NOTIFY lp_served` (`shared.db.served.CHANNEL`) with the row's new stamp, its `xmin`
('' when no row is left), from whatever writes it — a full run's flip, an incremental or
range run's rewrite, an operator's `UPDATE`. PostgreSQL delivers a notification when its
transaction commits and drops it when it rolls back, so the API processes holding the row
(`serving_layer.served_row`) hear of committed publications only.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

from shared.db.served import CHANNEL

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION served_view_announce() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(
                '{CHANNEL}',
                coalesce((SELECT xmin::text FROM served_view WHERE id = 1), '')
            );
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER served_view_announce "
        "AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON served_view "
        "FOR EACH STATEMENT EXECUTE FUNCTION served_view_announce()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER served_view_announce ON served_view")
    op.execute("DROP FUNCTION served_view_announce()")
