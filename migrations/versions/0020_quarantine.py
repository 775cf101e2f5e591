"""quarantine: a worker can be quarantined (workers.quarantined_at/by/reason, lifted_at/by), every change
and every fleet-check result of a worker is a row of worker_events (its history), and study_schedules
hold specs submitted on a schedule (every N seconds or daily at a UTC time) by the API processes' loop

Revision ID: 0020_quarantine
Revises: 0019_fleet
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_quarantine"
down_revision = "0019_fleet"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("quarantined_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("quarantined_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("quarantine_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("quarantine_study_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("quarantine_lifted_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("quarantine_lifted_by", sa.String(length=200), nullable=True))
    op.create_table(
        "worker_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(length=32), nullable=True),
        sa.Column("first_divergent_step", sa.BigInteger(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["worker_id"], ["workers.id"], name=op.f("fk_worker_events_worker_id_workers"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_worker_events_study_id_studies"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_events")),
    )
    op.create_index("ix_worker_events_worker_id_id", "worker_events", ["worker_id", "id"], unique=False)
    op.create_index("ix_worker_events_kind_id", "worker_events", ["kind", "id"], unique=False)
    op.create_table(
        "study_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("daily_at", sa.String(length=5), nullable=True),
        sa.Column("next_due_at", sa.DateTime(), nullable=False),
        sa.Column("last_fired_at", sa.DateTime(), nullable=True),
        sa.Column("last_study_id", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("fired_count", sa.Integer(), nullable=False),
        sa.Column("owner_token_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["owner_token_id"], ["api_tokens.id"],
                                name=op.f("fk_study_schedules_owner_token_id_api_tokens"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_study_schedules_name")),
    )
    op.create_index(op.f("ix_study_schedules_next_due_at"), "study_schedules", ["next_due_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_study_schedules_next_due_at"), table_name="study_schedules")
    op.drop_table("study_schedules")
    op.drop_index("ix_worker_events_kind_id", table_name="worker_events")
    op.drop_index("ix_worker_events_worker_id_id", table_name="worker_events")
    op.drop_table("worker_events")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("quarantine_lifted_by")
        batch.drop_column("quarantine_lifted_at")
        batch.drop_column("quarantine_study_id")
        batch.drop_column("quarantine_reason")
        batch.drop_column("quarantined_by")
        batch.drop_column("quarantined_at")
