"""study_stages: the stages of an adaptive study (seeds added under a budget, group-sequential verdicts)

Revision ID: 0010_stages
Revises: 0009_code
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0010_stages"
down_revision = "0009_code"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "study_stages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("seeds", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("judged_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("decisions", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_study_stages_study_id_studies"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_stages")),
        sa.UniqueConstraint("study_id", "stage", name=op.f("uq_study_stages_study_id_stage")),
    )
    op.create_index(op.f("ix_study_stages_study_id"), "study_stages", ["study_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_study_stages_study_id"), table_name="study_stages")
    op.drop_table("study_stages")
