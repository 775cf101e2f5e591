"""localization_jobs: requests to localize where two repeats of a study part, leased and replayed by a
worker (the run page's Localize button); the answer is kept in studies.localizations as before

Revision ID: 0018_localization_jobs
Revises: 0017_localizations
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_localization_jobs"
down_revision = "0017_localizations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "localization_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("run_a", sa.Integer(), nullable=False),
        sa.Column("run_b", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("required_labels", sa.JSON(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("requested_by", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("time_limit_at", sa.DateTime(), nullable=True),
        sa.Column("worker_id", sa.Integer(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("transition_request_id", sa.String(length=64), nullable=True),
        sa.Column("lease_request_id", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_localization_jobs_study_id_studies"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["requested_by"], ["api_tokens.id"],
                                name=op.f("fk_localization_jobs_requested_by_api_tokens"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["worker_id"], ["workers.id"], name=op.f("fk_localization_jobs_worker_id_workers"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_localization_jobs")),
    )
    op.create_index(op.f("ix_localization_jobs_study_id"), "localization_jobs", ["study_id"], unique=False)
    op.create_index("ix_localization_jobs_status_id", "localization_jobs", ["status", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_localization_jobs_status_id", table_name="localization_jobs")
    op.drop_index(op.f("ix_localization_jobs_study_id"), table_name="localization_jobs")
    op.drop_table("localization_jobs")
