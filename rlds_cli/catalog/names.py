"""What a dataset name given by a user refers to, for every command and the library.

``rlds inspect demo``, ``open_dataset("demo")``, ``Loader("demo")`` and the rest resolve names
through :func:`resolve_name`, so a registry alias works wherever a cached dataset's name does.
"""

from __future__ import annotations

import difflib
import os
from typing import TYPE_CHECKING

from rlds_cli.errors import DatasetNotFoundError, InvalidNameError

if TYPE_CHECKING:
    from rlds_cli.cache.root import CacheRoot

__all__ = ["resolve_name"]


def resolve_name(name: str, root: str | os.PathLike[str] | CacheRoot | None = None) -> str:
    """The name in the cache that ``name`` refers to.

    In order:

    1. a dataset of that name in the cache: ``name`` itself (a local name always wins, so a
       dataset you named ``demo`` hides the registry alias ``demo``);
    2. a registry id or alias whose dataset is in the cache under the name ``rlds download``
       gives it: that name (``demo`` -> ``pointmass-demo-v0``).

    Args:
        name: What the user typed: a cache name, or a registry id or alias.
        root: Cache root (a path or a :class:`~rlds_cli.cache.root.CacheRoot`; default: the
            configured one).

    Returns:
        A name for which ``CacheRoot(root).exists(...)`` is true.

    Raises:
        DatasetNotFoundError: Nothing in the cache answers to ``name``; the hint says how to get
            it (``rlds download`` for a registry id) or names close matches.
    """
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog import registry

    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    try:
        if cache.exists(name):
            return name
    except InvalidNameError:
        pass  # not a cache name (e.g. a RoboSet id with parentheses); maybe a registry id
    entry = registry.resolve(name) if registry.is_known(name) else None
    if entry is not None:
        if cache.exists(entry.cache_name):
            return entry.cache_name
        raise DatasetNotFoundError(
            f"no dataset named {name!r} in the cache at {cache.path} (registry id {entry.id!r}, "
            "not downloaded yet)",
            hint=f"download and convert it first: rlds download {name}",
        )
    cached = [m.name for m in cache.iter_manifests()]
    close = difflib.get_close_matches(name, cached, n=3, cutoff=0.6)
    hint = None
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? ('rlds list' shows the cached datasets)"
    raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {cache.path}", hint=hint)
