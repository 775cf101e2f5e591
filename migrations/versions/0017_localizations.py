"""studies.localizations: where two repeats of a study parted, as `steady localize` found it (the first
divergent step and op, per pair of runs); NULL when none was localized

Revision ID: 0017_localizations
Revises: 0016_metric_conflicts
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_localizations"
down_revision = "0016_metric_conflicts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("localizations", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("localizations")
