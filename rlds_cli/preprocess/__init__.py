"""``rlds preprocess``: apply a function to a cached dataset, in parallel, resumably, with lineage;
see ``docs/preprocessing.md``.

Public API::

    from rlds_cli import preprocess

    preprocess.run("hopper-medium-v2", "mypkg.norm:normalize", "hopper-medium-v2-norm", workers=2)
    preprocess.dry_run("hopper-medium-v2", "mypkg.norm:normalize")   # the output schema only
    preprocess.load_stats(dataset)                                   # statistics from --stats
    @preprocess.whole_episodes                                       # an episode-wise function

Names are imported lazily, so a spawned worker imports only :mod:`~rlds_cli.preprocess.pool` and
:mod:`~rlds_cli.preprocess.worker` and starts quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlds_cli._util.lazy import lazy_names

if TYPE_CHECKING:
    from rlds_cli.cache.stats import KeyStats
    from rlds_cli.cache.stats import load as load_stats
    from rlds_cli.preprocess.job import DryRun, PreprocessResult, dry_run, run
    from rlds_cli.preprocess.plan import whole_episodes

_LAZY = {
    "DryRun": ("rlds_cli.preprocess.job", "DryRun"),
    "PreprocessResult": ("rlds_cli.preprocess.job", "PreprocessResult"),
    "dry_run": ("rlds_cli.preprocess.job", "dry_run"),
    "run": ("rlds_cli.preprocess.job", "run"),
    "KeyStats": ("rlds_cli.cache.stats", "KeyStats"),
    "load_stats": ("rlds_cli.cache.stats", "load"),
    "whole_episodes": ("rlds_cli.preprocess.plan", "whole_episodes"),
}

__all__ = ["DryRun", "KeyStats", "PreprocessResult", "dry_run", "load_stats", "run", "whole_episodes"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)
