"""Minari datasets (HDF5, Arrow or Parquet storage), streamed episode by episode into flat TED.

A Minari dataset directory holds ``data/metadata.json`` and, by ``data_format``:

* ``hdf5``: ``data/main_data.hdf5``, one ``episode_{id}`` group per episode: ``observations`` (and
  ``infos/*``) with ``T + 1`` rows, the reset observation first; ``actions``, ``rewards``,
  ``terminations``, ``truncations`` with ``T`` rows. Dict spaces are groups, Tuple spaces groups
  of ``_index_<i>``.
* ``arrow`` / ``parquet`` (pyarrow, the ``arrow`` extra): ``data/<id>/`` per episode with
  ``part-0.arrow`` (or ``.parquet``) and ``metadata.json``. Every column has ``T + 1`` rows; the
  step columns' trailing zero padding row is dropped as minari's reader drops it. Dict and Tuple
  spaces are struct columns (Tuple fields ``"0"``, ``"1"``...), Box, MultiDiscrete and
  MultiBinary values fixed-size lists, images JPEG bytes.

Rules (``docs/formats.md``):

* Step ``t`` is ``(observations[t], actions[t]) -> observations[t + 1]`` with ``rewards[t]``,
  ``terminations[t]``, ``truncations[t]``; the final observation is real.
* Dict spaces become ``observation/<key>`` / ``action/<key>`` (nested further for nested dicts),
  Tuple spaces ``observation/0``, ``observation/1``...; a plain Box is ``observation``. Discrete
  actions are stored as the integer index (shape ``()``).
* ``infos/<k>`` with ``T + 1`` rows are observation-like: stored once as ``info/<k>``, read back
  at t (``info/<k>``) and t + 1 (``next/info/<k>``). ``infos/<k>`` with ``T`` rows are per-step
  ``info/<k>`` only. No row is padded or invented (TorchRL pads a zero row in front of T-row infos).
* Image spaces stored as JPEG bytes per frame (Minari >= 0.5.3) are kept as JPEG files
  (``--frames keep``, the default; decoded to ``uint8`` when read) or decoded (``--frames raw``).
* An episode whose last step has neither flag (collection stopped mid-episode) ends truncated,
  noted; a flag before the last step is an error.
* Every episode's ``seed`` (DataCollector draws 64 random bits when ``reset()`` gets none) is kept
  exactly in ``minari/episode_seed`` (uint64) with ``minari/episode_seed_present`` (bool).
* The spaces, env specs and the source path of every TED key go to the manifest
  (``source.metadata.spaces``), so ``rlds export --to minari`` can write the same spaces back.

Modules: :mod:`~rlds_cli.formats.minari.layout` (files, ``sniff``, ``source_files``, default
cache name, ``metadata.json`` and seeds, spaces and JPEG frames, the storage plug point);
:mod:`~rlds_cli.formats.minari.reader` (the storages and :class:`MinariReader`).
"""

from __future__ import annotations

from rlds_cli.formats.minari.layout import (
    ARROW_FORMATS,
    MAIN_FILE,
    METADATA_FILE,
    NAMESPACE_FILE,
    SEED_MAX,
    data_dir_of,
    default_name,
    find_datasets,
    is_image_space,
    sniff,
    source_files,
)
from rlds_cli.formats.minari.reader import MinariReader

__all__ = [
    "ARROW_FORMATS",
    "MAIN_FILE",
    "METADATA_FILE",
    "NAMESPACE_FILE",
    "SEED_MAX",
    "MinariReader",
    "data_dir_of",
    "default_name",
    "find_datasets",
    "is_image_space",
    "sniff",
    "source_files",
]
