"""The TED cache: layout, atomic builds, and read access.

The public names are imported lazily (as in ``rlds_cli/__init__.py``): importing one submodule,
such as ``rlds_cli.cache.dataset`` for reading, runs this file first and must not pull in the
writers (``builder``) with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlds_cli._util.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.cache.manifest import FieldSpec, Manifest
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cache.root import CacheRoot, validate_name
    from rlds_cli.cache.ted import TedBatch

#: Public name -> the submodule that defines it.
_LAZY = {
    "CacheRoot": "root",
    "validate_name": "root",
    "Dataset": "dataset",
    "open_dataset": "opening",
    "DatasetBuilder": "builder",
    "FieldSpec": "manifest",
    "Manifest": "manifest",
    "TedBatch": "ted",
}

__all__ = [
    "CacheRoot",
    "Dataset",
    "DatasetBuilder",
    "FieldSpec",
    "Manifest",
    "TedBatch",
    "open_dataset",
    "validate_name",
]


__getattr__, __dir__ = lazy_names(__name__, {k: "." + v for k, v in _LAZY.items()}, globals(), __all__)
