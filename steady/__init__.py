"""Steady: is my training stable?

The one installed name. The repository keeps the server in ``app/`` and the agent in ``worker/``;
pyproject.toml installs them as ``steady.server`` and ``steady.worker`` (and the Alembic scripts as
``steady.migrations``), so a wheel and an editable install hold one top-level package and nothing
generic reaches site-packages or a run's ``PYTHONPATH`` (docs/architecture.md).

User code logs through the SDK: ``from steady import sdk``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steady.worker.inrun import sdk as sdk

__all__ = ["sdk"]


def __getattr__(name: str) -> Any:
    # ``from steady import sdk`` without importing the agent (or anything else) for ``import steady``
    if name == "sdk":
        from steady.worker.inrun import sdk

        return sdk
    raise AttributeError(f"module 'steady' has no attribute {name!r}")
