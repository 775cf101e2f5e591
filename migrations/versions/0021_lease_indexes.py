"""lease indexes: a lease reads the runs of its candidates' blocks (runs.study_id, runs.seed), the runs its
worker holds (runs.worker_id, runs.status) and the runs past their time limit (runs.status,
runs.time_limit_at) by index, so its work does not grow with the runs started or running

Revision ID: 0021_lease_indexes
Revises: 0020_quarantine
"""
from __future__ import annotations

from alembic import op

revision = "0021_lease_indexes"
down_revision = "0020_quarantine"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # None on lease_expires_at: every heartbeat changes it, and an index on it would make each heartbeat's
    # UPDATE write every index of the row instead of a heap-only tuple on PostgreSQL.
    op.create_index("ix_runs_study_id_seed", "runs", ["study_id", "seed"], unique=False)
    op.create_index("ix_runs_worker_id_status", "runs", ["worker_id", "status"], unique=False)
    op.create_index("ix_runs_status_time_limit_at", "runs", ["status", "time_limit_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_status_time_limit_at", table_name="runs")
    op.drop_index("ix_runs_worker_id_status", table_name="runs")
    op.drop_index("ix_runs_study_id_seed", table_name="runs")
