from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from steady.server.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    from steady.server.kit.db import make_engine

    # The plain `alembic` CLI: the URL comes from alembic.ini if one is set there, else from the
    # server's own settings (STEADY_DATABASE_URL, or the embedded SQLite file under STEADY_DATA_DIR).
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from steady.server.kit.config import Settings

        url = Settings().resolved_database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
