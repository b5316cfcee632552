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


#: Plug points a lower layer calls and a layer above fills in: point -> ``"module:attr"``. The
#: front door (``rlds_cli/__init__``, which stands on every layer and runs before any submodule)
#: fills them, so e.g. :attr:`rlds_cli.cache.dataset.Dataset.env_spec` reaches
#: :mod:`rlds_cli.catalog.envspec` (which reads the registry) without the cache importing the layer above.
_PROVIDED: dict[str, str] = {}


def provide(point: str, target: str) -> None:
    """Fill the plug point ``point`` with the object ``target`` (``"module:attr"``) names; the
    module is imported only when the point is first called through :func:`provided`."""
    _PROVIDED[point] = target


def provided(point: str) -> Any:
    """The object that fills ``point`` (its module imported now).

    Raises:
        LookupError: Nothing fills ``point`` (a wiring mistake of the package, not of the user).
    """
    try:
        target = _PROVIDED[point]
    except KeyError:
        raise LookupError(f"plug point {point!r} is not filled in (rlds_cli/__init__.py fills it)") from None
    return load(target)
