"""rlds: an offline-RL dataset manager (CLI ``rlds``) and a fast PyTorch loader.

The public names are imported lazily so that ``import rlds_cli`` (and ``rlds --help``)
stays fast and never imports torch unless the loader is used.

``download`` and ``convert`` are the functions behind ``rlds download`` (their modules live in
:mod:`rlds_cli.sources`, so importing them never rebinds these names).
"""

from __future__ import annotations

from rlds_cli._util.lazy import lazy_names
from rlds_cli._version import __version__

_LAZY = {
    "open_dataset": "rlds_cli.loader.opening",
    "Dataset": "rlds_cli.cache.dataset",
    "TedBatch": "rlds_cli.cache.ted",
    "CacheRoot": "rlds_cli.cache.root",
    "Loader": "rlds_cli.loader",
    "MixtureLoader": "rlds_cli.loader",
    "UniformSampler": "rlds_cli.loader",
    "EpochSampler": "rlds_cli.loader",
    "SliceSampler": "rlds_cli.loader",
    "PrioritizedSampler": "rlds_cli.loader",
    "resolve_name": "rlds_cli.catalog.registry",
    "list_datasets": "rlds_cli.inspection.listing",
    "list_registry": "rlds_cli.inspection.listing",
    "registry_status": "rlds_cli.inspection.listing",
    "CachedDataset": "rlds_cli.inspection.listing",
    "RegistryDataset": "rlds_cli.inspection.listing",
    "DatasetWriter": "rlds_cli.write.writer",
    "compact": "rlds_cli.write.compact",
    "record": "rlds_cli.recording.recorder",
    "recording_writer": "rlds_cli.recording.recorder",
    "RecordEpisodes": "rlds_cli.recording.recorder",
    "audit": "rlds_cli.inspection.audit",
    "AuditReport": "rlds_cli.inspection.audit",
    "write_episode_page": "rlds_cli.inspection.viewer",
    "episode_page": "rlds_cli.inspection.viewer",
    "write_rerun": "rlds_cli.inspection.viewer",
    "normalized_score": "rlds_cli.catalog.scores",
    "reference_scores": "rlds_cli.catalog.scores",
    "ReferenceScores": "rlds_cli.catalog.scores",
    "NormalizationStats": "rlds_cli.loader.normalization",
    "NormalizationTable": "rlds_cli.loader.normalization_table",
    "RecordedEnvSpec": "rlds_cli.cache.env_spec",
    "EpisodeTable": "rlds_cli.cache.episode_table",
    "download": "rlds_cli.sources.download",
    "convert": "rlds_cli.sources.convert",
    "push": "rlds_cli.remote.push",
    "pull": "rlds_cli.remote.pull",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)
