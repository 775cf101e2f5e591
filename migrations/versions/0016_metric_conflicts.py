"""runs.metric_conflicts: values a run logged twice, differently, for one (key, step): the first
conflicts in full (both values and where each came from) and how many in all; NULL when none

Revision ID: 0016_metric_conflicts
Revises: 0015_run_argv
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_metric_conflicts"
down_revision = "0015_run_argv"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("metric_conflicts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("metric_conflicts")
