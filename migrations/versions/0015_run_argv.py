"""runs.argv: a command workload's argv as the worker ran it (placeholders filled), so a run's record
says what was executed, not only the template the study gave

Revision ID: 0015_run_argv
Revises: 0014_chunk_resolution
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_run_argv"
down_revision = "0014_chunk_resolution"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("argv", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("argv")
