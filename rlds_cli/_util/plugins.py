"""Plug-point tables: a name mapped to ``"module:attr"``, imported only when asked for.

The source formats (:data:`rlds_cli.formats.READERS`), the exporters
(:data:`rlds_cli.export.EXPORTERS`) and the preprocess executors
(:data:`rlds_cli.preprocess.executors.EXECUTORS`) are such tables, so naming a format or listing
them imports none of their modules; :func:`resolve` is the one way a name becomes its object.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from rlds_cli.errors import RldsError


def load(target: str) -> Any:
    """The object a ``"module:attr"`` string names (the module imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def resolve(table: Mapping[str, str], name: str, *, what: str, error: type[RldsError]) -> Any:
    """The object ``table[name]`` names.

    Args:
        table: Names -> ``"module:attr"``.
        name: The name asked for.
        what: What a name is, for the message (``"export format"``).
        error: The error raised for a name not in ``table`` (one line naming it, and a hint
            listing the known names).
    """
    try:
        target = table[name]
    except KeyError:
        raise error(f"unknown {what} {name!r}", hint=f"known: {', '.join(sorted(table))}") from None
    return load(target)
