"""Contracts: migrations match the models, the OpenAPI document is a committed snapshot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from steady.server.models import Base

SNAPSHOT = Path(__file__).with_name("openapi.json")
UPDATE = "STEADY_UPDATE_SNAPSHOT=1 pytest tests/api/test_schema.py"


def test_migrations_match_models(db_url):
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"


def test_server_refuses_database_not_at_head(tmp_path):
    import pytest
    from sqlalchemy import text

    from steady.server.kit import migrate
    from steady.server.kit.db import Database

    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(db.engine)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0000'"))
    with pytest.raises(migrate.SchemaError, match="steady migrate"):
        migrate.verify(db.engine)


def test_openapi_snapshot(tmp_path):
    """Every wire change is deliberate: a missing or different snapshot fails; regenerate it with
    STEADY_UPDATE_SNAPSHOT=1 and review the diff."""
    current = json.dumps(_openapi(tmp_path), indent=1, sort_keys=True) + "\n"
    if os.environ.get("STEADY_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), f"no OpenAPI snapshot at {SNAPSHOT}: {UPDATE}"
    assert current == SNAPSHOT.read_text(), f"the OpenAPI document changed: {UPDATE}"


def _openapi(tmp_path) -> dict:
    from steady.server.kit.config import Settings
    from steady.server.web.main import create_app

    return create_app(Settings(data_dir=tmp_path)).openapi()


def _bare_objects(schema: object, components: dict, path: str, seen: set[str]) -> list[str]:
    """Where ``schema`` (resolving $refs) has an object with no declared properties: free-form data."""
    if isinstance(schema, list):
        return [p for i, s in enumerate(schema) for p in _bare_objects(s, components, f"{path}[{i}]", seen)]
    if not isinstance(schema, dict):
        return []
    ref = schema.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[1]
        if name in seen:
            return []
        return _bare_objects(components[name], components, f"{path}->{name}", seen | {name})
    found = []
    if schema.get("type") == "object" and not schema.get("properties"):
        extra = schema.get("additionalProperties", True)
        if extra is True or extra == {}:  # a map of known values (additionalProperties: {schema}) is typed
            found.append(path)
    for key, sub in schema.items():
        if key in {"properties", "items", "anyOf", "oneOf", "allOf", "additionalProperties", "prefixItems"}:
            if key == "properties":
                found += [p for k, s in sub.items() for p in _bare_objects(s, components, f"{path}.{k}", seen)]
            else:
                found += _bare_objects(sub, components, f"{path}.{key}", seen)
    return found


@pytest.mark.parametrize("route", ["/api/v1/studies/{study_id}/report", "/api/v1/studies/{study_id}/bands",
                                   "/api/v1/compare", "/api/v1/suites/{suite}/baseline/compare"])
def test_report_responses_describe_every_field(tmp_path, route):
    """The report, bands and compare responses are typed all the way down: no free-form object where
    the fields are known, and every verdict names its level and its level's verdict values."""
    doc = _openapi(tmp_path)
    components = doc["components"]["schemas"]
    schema = doc["paths"][route]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "$ref" in schema, schema
    assert _bare_objects(schema, components, route, set()) == []
    if route.endswith("/report"):
        verdicts = components["Report"]["properties"]["verdicts"]["items"]
        assert set(verdicts["discriminator"]["mapping"]) == {"repeatability", "seed_stability", "stack_portability"}
        seed = components["SeedStabilityVerdict"]["properties"]["verdict"]
        assert set(seed["enum"]) == {"stable", "unstable", "inconclusive", "seed_has_no_effect"}
