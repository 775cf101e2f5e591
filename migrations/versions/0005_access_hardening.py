"""access hardening: owners, run exclusion, dashboard sessions

Revision ID: 0005_access_hardening
Revises: 0004_report_cache
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0005_access_hardening"
down_revision = '0004_report_cache'
branch_labels = None
depends_on = None


def _owner(table: str, *, index: bool = False) -> None:
    with op.batch_alter_table(table, schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner_token_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f(f"fk_{table}_owner_token_id_api_tokens"), "api_tokens", ["owner_token_id"], ["id"],
            ondelete="SET NULL",
        )
        if index:
            batch_op.create_index(batch_op.f(f"ix_{table}_owner_token_id"), ["owner_token_id"], unique=False)


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_dashboard_sessions_token_id_api_tokens"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dashboard_sessions")),
        sa.UniqueConstraint("id_hash", name=op.f("uq_dashboard_sessions_id_hash")),
    )
    with op.batch_alter_table("dashboard_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_token_id"), ["token_id"], unique=False)
    _owner("studies", index=True)
    _owner("alert_rules")
    _owner("suite_baselines")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("excluded_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("excluded_by", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("excluded_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("excluded_reason")
        batch_op.drop_column("excluded_by")
        batch_op.drop_column("excluded_at")
    for table in ("suite_baselines", "alert_rules", "studies"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            if table == "studies":
                batch_op.drop_index(batch_op.f("ix_studies_owner_token_id"))
            batch_op.drop_constraint(batch_op.f(f"fk_{table}_owner_token_id_api_tokens"), type_="foreignkey")
            batch_op.drop_column("owner_token_id")
    with op.batch_alter_table("dashboard_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dashboard_sessions_token_id"))
    op.drop_table("dashboard_sessions")
