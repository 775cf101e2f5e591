"""baseline_snapshots: a suite baseline is a frozen, content-addressed snapshot with a version history

Revision ID: 0008_baseline_snapshots
Revises: 0007_series_dtype

Baselines set before this revision keep ``snapshot_id`` NULL and are read from the live runs
until they are moved (``PUT /api/v1/suites/{suite}/baseline``), which snapshots them.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0008_baseline_snapshots"
down_revision = "0007_series_dtype"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "baseline_snapshots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("stack", sa.String(length=200), nullable=True),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("n_runs", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("created_by_token_id", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_baseline_snapshots_study_id_studies"),
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["created_by_token_id"], ["api_tokens.id"],
                                name=op.f("fk_baseline_snapshots_created_by_token_id_api_tokens"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_baseline_snapshots")),
        sa.UniqueConstraint("suite", "version", name=op.f("uq_baseline_snapshots_suite_version")),
    )
    with op.batch_alter_table("baseline_snapshots") as batch:
        batch.create_index(batch.f("ix_baseline_snapshots_suite"), ["suite"], unique=False)
    with op.batch_alter_table("suite_baselines") as batch:
        batch.add_column(sa.Column("snapshot_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(batch.f("fk_suite_baselines_snapshot_id_baseline_snapshots"), "baseline_snapshots",
                                 ["snapshot_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("suite_baselines") as batch:
        batch.drop_constraint(batch.f("fk_suite_baselines_snapshot_id_baseline_snapshots"), type_="foreignkey")
        batch.drop_column("snapshot_id")
    with op.batch_alter_table("baseline_snapshots") as batch:
        batch.drop_index(batch.f("ix_baseline_snapshots_suite"))
    op.drop_table("baseline_snapshots")
