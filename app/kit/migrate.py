"""Schema management: the server upgrades an empty or old database to head on start.

Several API processes may start at once against one PostgreSQL: the upgrade runs under an
advisory lock so exactly one of them migrates and the others wait.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

MIGRATIONS_DIR = Path(__file__).parents[2] / "migrations"  # steady/migrations in the wheel, migrations/ in a checkout
_PG_LOCK_KEY = 0x57EAD1  # arbitrary, constant across Steady processes


class SchemaError(RuntimeError):
    pass


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations in {MIGRATIONS_DIR}")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> None:
    cfg = alembic_config()
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        finally:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()


def verify(engine: Engine) -> None:
    """Refuse to serve a database that is not at the head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaError(
            f"database schema is at {current or 'nothing'}, this Steady needs {head}: run `steady migrate`"
        )
