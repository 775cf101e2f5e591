"""The server's infrastructure: settings, the database and its sessions, errors and their responses,
migrations, pagination, the repository base, wire floats, background loops, request dependencies and the
API tokens behind them.

Imports no domain package (it may import the tables, :mod:`steady.server.models`, and the stats core);
every domain imports it. See docs/architecture.md.
"""
