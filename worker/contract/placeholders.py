"""A command workload's placeholders (``{seed}``, ``{run_dir}``, …): plain names, filled by the worker.

``str.format`` would also take a format spec, a conversion or a nested field (``{seed:>1000000000}`` pads
an argument to a gigabyte; ``{seed:{foo}}`` hides a second field inside the spec), so neither side uses it:
the server refuses such an argument at submit (:func:`placeholder_names`), and the worker, which must not
trust that the server checked, fills arguments with :func:`fill` and refuses them again.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from steady.worker.contract.protocol import COMMAND_PLACEHOLDERS
_KNOWN = ", ".join("{" + p + "}" for p in COMMAND_PLACEHOLDERS)


class PlaceholderError(ValueError):
    """A command argument no run can take: a NUL byte, or placeholders that are not plain known names."""


def placeholder_names(arg: str, position: int | None = None) -> list[str]:
    """The placeholder names in ``arg``, in order; :class:`PlaceholderError` naming the argument and the
    reason for a NUL byte (no program can receive one: exec takes C strings), a malformed brace, a format
    spec, a conversion, or an unknown name (``position``: the argument's place in the command, from 1)."""
    what = f"command argument {arg!r}" if position is None else f"command argument {position} ({arg!r})"
    if "\x00" in arg:
        raise PlaceholderError(f"{what} holds a NUL byte, which no program can receive in its "
                               "arguments: remove it")
    try:
        parts = list(string.Formatter().parse(arg))
    except ValueError as exc:
        raise PlaceholderError(f"{what}: {exc} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if spec or conversion:
            raise PlaceholderError(
                f"{what}: placeholder {{{name}}} carries a format spec or conversion "
                f"({'!' + conversion if conversion else ''}{':' + spec if spec else ''}); placeholders are "
                "names only: write e.g. {seed}")
        if name not in COMMAND_PLACEHOLDERS:
            raise PlaceholderError(f"{what} has unknown placeholder {name!r}; known: {_KNOWN}")
        names.append(name)
    return names


def fill(arg: str, values: Mapping[str, object]) -> str:
    """``arg`` with each placeholder replaced by ``str(values[name])`` (checked as :func:`placeholder_names`)."""
    placeholder_names(arg)
    return "".join(literal + (str(values[name]) if name is not None else "")
                   for literal, name, _, _ in string.Formatter().parse(arg))


def fill_command(command: list[str], values: Mapping[str, object], python: str) -> list[str]:
    """A command's argv with its placeholders filled, ``python``/``python3`` as first word being ``python``."""
    argv = [fill(arg, values) for arg in command]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = python
    return argv
