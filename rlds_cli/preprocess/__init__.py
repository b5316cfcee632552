"""``rlds preprocess``: apply a function to a cached dataset, in parallel, resumably, with
lineage; see ``docs/preprocessing.md``.

Public API::

    from rlds_cli import preprocess

    preprocess.run("hopper-medium-v2", "mypkg.norm:normalize", "hopper-medium-v2-norm", workers=2)
    preprocess.dry_run("hopper-medium-v2", "mypkg.norm:normalize")   # the output schema only
    preprocess.load_stats(dataset)                                   # statistics from --stats
"""

from __future__ import annotations

from rlds_cli.preprocess.job import DryRun, PreprocessResult, dry_run, run
from rlds_cli.preprocess.stats import KeyStats
from rlds_cli.preprocess.stats import load as load_stats

__all__ = ["DryRun", "KeyStats", "PreprocessResult", "dry_run", "load_stats", "run"]
