"""run usage: runs.stored_points and runs.stored_keys hold the points and the distinct metric keys of the run's
current attempt, kept with every chunk written or deleted, so a metric batch reads its run's usage from the run's
row instead of summing every chunk the attempt holds; filled from the chunks already stored. The index that
served that sum (ix_metric_chunks_usage, 0011) goes: a batch's lookups of its keys and its seq are served by
ix_metric_chunks_run_id_key and the unique (run_id, attempt, seq, key), and each chunk written has one index
fewer to update

Revision ID: 0022_run_usage
Revises: 0021_lease_indexes
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_run_usage"
down_revision = "0021_lease_indexes"
branch_labels = None
depends_on = None


# ALTER TABLE in place on SQLite as on PostgreSQL, not batch mode: rebuilding runs would drop and re-create the
# table, and with foreign keys on, its chunks would go with it.
def upgrade() -> None:
    op.add_column("runs", sa.Column("stored_points", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("runs", sa.Column("stored_keys", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        "UPDATE runs SET "
        "stored_points = (SELECT COALESCE(SUM(c.n), 0) FROM metric_chunks c "
        "WHERE c.run_id = runs.id AND c.attempt = runs.attempt), "
        "stored_keys = (SELECT COUNT(DISTINCT c.key) FROM metric_chunks c "
        "WHERE c.run_id = runs.id AND c.attempt = runs.attempt) "
        "WHERE EXISTS (SELECT 1 FROM metric_chunks c WHERE c.run_id = runs.id AND c.attempt = runs.attempt)"
    )
    op.drop_index("ix_metric_chunks_usage", table_name="metric_chunks")


def downgrade() -> None:
    op.create_index("ix_metric_chunks_usage", "metric_chunks", ["run_id", "attempt", "key", "n"])
    op.execute("ALTER TABLE runs DROP COLUMN stored_keys")  # SQLite >= 3.35 drops a column in place
    op.execute("ALTER TABLE runs DROP COLUMN stored_points")
