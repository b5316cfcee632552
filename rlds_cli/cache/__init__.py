"""The TED cache: layout, atomic builds, and read access."""

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset, open_dataset
from rlds_cli.cache.manifest import FieldSpec, Manifest
from rlds_cli.cache.root import CacheRoot, validate_name
from rlds_cli.cache.ted import TedBatch

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
