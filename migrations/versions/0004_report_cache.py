"""study_reports: each settled study's report, computed once in the background, by study version

Revision ID: 0004_report_cache
Revises: 0003_engines
Create Date: 2026-11-29 20:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0004_report_cache'
down_revision = '0003_engines'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('study_reports',
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.String(length=500), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=True),
    sa.Column('computed_at', sa.DateTime(), nullable=False),
    sa.Column('compute_seconds', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_study_reports_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('study_id', name=op.f('pk_study_reports'))
    )


def downgrade() -> None:
    op.drop_table('study_reports')
