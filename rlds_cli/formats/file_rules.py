"""A reader's file rules taken from its format's layout module, declared once.

A format package keeps what its sources look like in one module (``layout.py`` or ``files.py``):
``sniff`` (is this path of the format), ``source_files`` (which files a conversion reads, in
order) and ``EXPECTED_FILES`` (the words a hint uses). :func:`from_layout` makes them the
reader's :attr:`~rlds_cli.formats.base.Reader.sniff`, :attr:`~rlds_cli.formats.base.Reader.source_files`
and :attr:`~rlds_cli.formats.base.Reader.expected_files`, so no reader restates them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from rlds_cli.formats.base import Reader

R = TypeVar("R", bound=type[Reader])

#: The functions a layout module provides, set on the reader as static methods.
RULES = ("sniff", "source_files")


def from_layout(layout: ModuleType) -> Callable[[R], R]:
    """Class decorator: the reader's ``sniff``, ``source_files`` and ``expected_files`` are
    ``layout``'s (``sniff``, ``source_files``, ``EXPECTED_FILES``)."""

    def apply(cls: R) -> R:
        for name in RULES:
            setattr(cls, name, staticmethod(getattr(layout, name)))
        cls.expected_files = layout.EXPECTED_FILES
        return cls

    return apply
