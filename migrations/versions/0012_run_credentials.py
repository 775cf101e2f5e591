"""runs.run_token_hash (the run-scoped credential of the current lease) and runs.mlflow
(params, tags, name and status written through the MLflow-compatible endpoint)

Revision ID: 0012_run_credentials
Revises: 0011_chunk_usage_index
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_run_credentials"
down_revision = "0011_chunk_usage_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("run_token_hash", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("mlflow", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("mlflow")
        batch.drop_column("run_token_hash")
