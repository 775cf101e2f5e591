"""baseline_snapshots.action: clearing a suite's baseline is a recorded version too ("cleared", with
who, when and why), so the history shows a suite that went without a baseline; a cleared row holds
no content (``digest`` and ``body`` NULL)

Revision ID: 0013_baseline_clear
Revises: 0012_run_credentials
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_baseline_clear"
down_revision = "0012_run_credentials"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("baseline_snapshots") as batch:
        batch.add_column(sa.Column("action", sa.String(length=16), nullable=False, server_default="set"))
        batch.alter_column("digest", existing_type=sa.String(length=64), nullable=True)
        batch.alter_column("body", existing_type=sa.LargeBinary(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM baseline_snapshots WHERE action = 'cleared'")
    with op.batch_alter_table("baseline_snapshots") as batch:
        batch.alter_column("body", existing_type=sa.LargeBinary(), nullable=False)
        batch.alter_column("digest", existing_type=sa.String(length=64), nullable=False)
        batch.drop_column("action")
