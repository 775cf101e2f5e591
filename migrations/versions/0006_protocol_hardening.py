"""protocol hardening: request ids for retried worker calls, server-side time limit

Revision ID: 0006_protocol_hardening
Revises: 0005_access_hardening
Create Date: 2026-11-29 20:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006_protocol_hardening'
down_revision = '0005_access_hardening'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('time_limit_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('transition_request_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('transition_status', sa.String(length=16), nullable=True))
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_request_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('lease_run_id', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_column('lease_run_id')
        batch_op.drop_column('lease_request_id')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('transition_status')
        batch_op.drop_column('transition_request_id')
        batch_op.drop_column('time_limit_at')
