"""engine jobs: launches of agent batch jobs; the engine job of each worker and run

Revision ID: 0003_engines
Revises: 0002
Create Date: 2026-11-29 19:50:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0003_engines'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('launches',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=200), nullable=False),
    sa.Column('tasks', sa.Integer(), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_launches_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_launches'))
    )
    with op.batch_alter_table('launches', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_launches_study_id'), ['study_id'], unique=False)
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('engine', sa.JSON(), nullable=True))
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('engine', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('engine')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_column('engine')
    with op.batch_alter_table('launches', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_launches_study_id'))
    op.drop_table('launches')
