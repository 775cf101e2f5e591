"""Contracts: migrations match the models, the OpenAPI document is a committed snapshot."""

from __future__ import annotations

import json
import os
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from app.models import Base

SNAPSHOT = Path(__file__).with_name("openapi.json")


def test_migrations_match_models(db_url):
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"


def test_server_refuses_database_not_at_head(tmp_path):
    import pytest
    from sqlalchemy import text

    from app import migrate
    from app.db import Database

    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(db.engine)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0000'"))
    with pytest.raises(migrate.SchemaError, match="steady migrate"):
        migrate.verify(db.engine)


def test_openapi_snapshot(tmp_path):
    """Every wire change is deliberate: regenerate with STEADY_UPDATE_SNAPSHOT=1 and review the diff."""
    from app.config import Settings
    from app.main import create_app

    doc = create_app(Settings(data_dir=tmp_path)).openapi()
    current = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if os.environ.get("STEADY_UPDATE_SNAPSHOT") == "1" or not SNAPSHOT.exists():
        SNAPSHOT.write_text(current)
    assert current == SNAPSHOT.read_text(), "the OpenAPI document changed: STEADY_UPDATE_SNAPSHOT=1 pytest tests/api/test_schema.py"
