"""metric_chunks.dtype: the type a series' values were logged in

Revision ID: 0007_series_dtype
Revises: 0006_protocol_hardening
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_series_dtype"
down_revision = "0006_protocol_hardening"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_chunks") as batch:
        batch.add_column(sa.Column("dtype", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_chunks") as batch:
        batch.drop_column("dtype")
