"""metric_chunks.resolution: values parsed from printed text (a run's stdout) carry the unit of their
last printed digit (1e-4 for "0.1234"); differences between them are counted in it, not in ULPs.
NULL: binary floats (the SDK, TensorBoard, MLflow), as every chunk stored before

Revision ID: 0014_chunk_resolution
Revises: 0013_baseline_clear
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_chunk_resolution"
down_revision = "0013_baseline_clear"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN (no batch copy): the table holds every metric point
    op.add_column("metric_chunks", sa.Column("resolution", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_chunks") as batch:
        batch.drop_column("resolution")
