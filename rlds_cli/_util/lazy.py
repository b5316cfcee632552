"""Names imported when first used: a package's lazy public names, and plug-point tables.

:func:`lazy_names` (PEP 562) serves ``rlds_cli`` and the packages ``cache``, ``loader`` and
``preprocess``: importing one submodule runs the package's ``__init__``, which must not pull in
the writers, torch or the readers.

Plug-point tables map a name to ``"module:attr"`` (:data:`rlds_cli.formats.READERS`,
:data:`rlds_cli.export.EXPORTERS`, :data:`rlds_cli.preprocess.executors.EXECUTORS`); listing them
imports nothing, and :func:`resolve` imports only the module asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlds_cli.errors import RldsError


def lazy_names(
    package: str,
    table: Mapping[str, str | tuple[str, str]],
    namespace: dict[str, Any],
    exported: Iterable[str],
    *,
    before: Callable[[str], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``.

    Args:
        package: The package's name (``__name__``).
        table: Public name -> its module (``".sources"``: relative to ``package``), or
            ``(module, attribute)`` where the attribute has another name.
        namespace: The package's ``globals()``: a name, once imported, is kept there.
        exported: What ``dir()`` lists (``__all__``).
        before: Called with the module's full name before it is imported (e.g. to report a
            missing extra).
    """
    listed = sorted(set(exported))

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = target if isinstance(target, tuple) else (target, name)
        if module.startswith("."):
            module = package + module
        if before is not None:
            before(module)
        value = getattr(importlib.import_module(module), attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return listed

    return __getattr__, __dir__


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
