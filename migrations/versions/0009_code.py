"""Code shipping: content-addressed code archives (metadata, optional database chunks) and the
study's code digest, git commit, dirty flag and a status reason

Revision ID: 0009_code
Revises: 0008_baseline_snapshots
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_code"
down_revision = "0008_baseline_snapshots"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_archives",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("store", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),  # as UTCDateTime stores it
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_code_archives")),
    )
    op.create_table(
        "code_chunks",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["sha256"], ["code_archives.sha256"], name=op.f("fk_code_chunks_sha256_code_archives"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sha256", "idx", name=op.f("pk_code_chunks")),
    )
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("code_sha256", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("code_git_commit", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("code_dirty", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("status_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("status_reason")
        batch.drop_column("code_dirty")
        batch.drop_column("code_git_commit")
        batch.drop_column("code_sha256")
    op.drop_table("code_chunks")
    op.drop_table("code_archives")
