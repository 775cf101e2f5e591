"""fleet: a run can be pinned to one worker (runs.pinned_worker, the worker's id), which alone may lease
it, until runs.pinned_until; past it a pinned run still queued is failed with the reason (its worker is
gone), so a fleet check never waits forever on a worker that left

Revision ID: 0019_fleet
Revises: 0018_localization_jobs
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_fleet"
down_revision = "0018_localization_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No foreign key on purpose: deleting a worker must not unpin its runs (ON DELETE SET NULL would
    # hand them to any worker); the reaper fails them at pinned_until instead.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("pinned_worker", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pinned_until", sa.DateTime(), nullable=True))
    op.create_index("ix_runs_pinned_worker_status", "runs", ["pinned_worker", "status"], unique=False)
    # the reaper's look for expired pins on every lease: a range scan of the queued runs past pinned_until only
    op.create_index("ix_runs_status_pinned_until", "runs", ["status", "pinned_until"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_status_pinned_until", table_name="runs")
    op.drop_index("ix_runs_pinned_worker_status", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("pinned_until")
        batch.drop_column("pinned_worker")
