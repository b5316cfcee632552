"""rlds: an offline-RL dataset manager (CLI ``rlds``) and a fast PyTorch loader.

The public names are imported lazily so that ``import rlds_cli`` (and ``rlds --help``)
stays fast and never imports torch unless the loader is used.

``convert`` is deliberately not one of them: ``rlds_cli.convert`` is a submodule, and importing it
(as ``rlds download`` does) rebinds that attribute to the module, so a lazy function of the same
name would silently change type. Use ``from rlds_cli.convert import convert``.
"""

from __future__ import annotations

from rlds_cli import plugins as _plugins
from rlds_cli._lazy import lazy_names
from rlds_cli._version import __version__

_LAZY = {
    "open_dataset": "rlds_cli.opening",
    "Dataset": "rlds_cli.cache.dataset",
    "TedBatch": "rlds_cli.cache.ted",
    "CacheRoot": "rlds_cli.cache.root",
    "Loader": "rlds_cli.loader",
    "MixtureLoader": "rlds_cli.loader",
    "UniformSampler": "rlds_cli.loader",
    "EpochSampler": "rlds_cli.loader",
    "SliceSampler": "rlds_cli.loader",
    "PrioritizedSampler": "rlds_cli.loader",
    "resolve_name": "rlds_cli.names",
    "list_datasets": "rlds_cli.catalog",
    "list_registry": "rlds_cli.catalog",
    "registry_status": "rlds_cli.catalog",
    "CachedDataset": "rlds_cli.catalog",
    "RegistryDataset": "rlds_cli.catalog",
    "DatasetWriter": "rlds_cli.write.writer",
    "compact": "rlds_cli.write.compact",
    "record": "rlds_cli.recording.recorder",
    "recording_writer": "rlds_cli.recording.recorder",
    "RecordEpisodes": "rlds_cli.recording.wrapper",
    "normalized_score": "rlds_cli.scores",
    "reference_scores": "rlds_cli.scores",
    "ReferenceScores": "rlds_cli.scores",
    "NormalizationStats": "rlds_cli.normalization",
    "RecordedEnvSpec": "rlds_cli.envspec",
    "EpisodeTable": "rlds_cli.cache.episode_table",
    "push": "rlds_cli.remote.push",
    "pull": "rlds_cli.remote.pull",
}

__all__ = ["__version__", *_LAZY]

#: The plug points of the lower layers, filled with the modules above them (imported when used):
#: a :class:`Dataset` reads its environment through :mod:`rlds_cli.envspec`, which asks the registry.
_plugins.provide("dataset.env_spec", "rlds_cli.envspec:dataset_env_spec")
_plugins.provide("dataset.recover_environment", "rlds_cli.envspec:recover_environment")


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)
