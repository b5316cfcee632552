"""Minari datasets (HDF5, Arrow or Parquet storage), streamed episode by episode into flat TED.

A Minari dataset directory holds ``data/metadata.json`` and, depending on its ``data_format``:

* ``hdf5``: ``data/main_data.hdf5`` with one ``episode_{id}`` group per episode: ``observations``
  (and ``infos/*``) with ``T + 1`` rows, the reset observation first; ``actions``, ``rewards``,
  ``terminations``, ``truncations`` with ``T`` rows. Dict spaces are groups, Tuple spaces groups
  of ``_index_<i>``.
* ``arrow`` / ``parquet`` (read with pyarrow, the ``arrow`` extra): one directory
  ``data/<id>/`` per episode with ``part-0.arrow`` (or ``.parquet``) and ``metadata.json``. Every
  column has ``T + 1`` rows: ``actions``, ``rewards``, ``terminations`` and ``truncations`` carry a
  zero padding row at the end, which is dropped exactly as minari's own reader drops it. Dict and
  Tuple spaces are struct columns (Tuple fields named ``"0"``, ``"1"``...), Box, MultiDiscrete and
  MultiBinary values fixed-size lists, images JPEG bytes.

The rules below are written out in ``docs/formats.md``:

* Step ``t`` of an episode is ``(observations[t], actions[t]) -> observations[t + 1]`` with
  ``rewards[t]``, ``terminations[t]``, ``truncations[t]``: the final observation is real, so
  nothing is dropped or made up.
* Dict spaces (observations and actions) become ``observation/<key>`` / ``action/<key>``
  (nested dicts nest further), Tuple spaces ``observation/0``, ``observation/1``...; a plain Box
  is ``observation``. Discrete actions are stored as the integer index (``action`` of shape ``()``).
* ``infos/<k>`` with ``T + 1`` rows are observation-like: stored once as ``info/<k>`` and read
  back as ``info/<k>`` (at t) and ``next/info/<k>`` (at t + 1). ``infos/<k>`` with ``T`` rows
  are per-step values, stored as ``info/<k>`` only. No row is padded or invented (TorchRL pads a
  zero row in front of T-row infos).
* Image spaces that Minari >= 0.5.3 stored as JPEG bytes per frame are kept as those JPEG files
  (``--frames keep``, the default; decoded to ``uint8`` when read) or decoded (``--frames raw``).
* An episode whose last step has neither flag (a collection stopped mid-episode) ends
  truncated, noted; a flag before the last step is an error.
* Every episode's ``seed`` (DataCollector draws 64 random bits when ``reset()`` is given none) is
  kept exactly in ``minari/episode_seed`` (uint64) with ``minari/episode_seed_present`` (bool).
* The spaces, env specs and the source path of every TED key go to the manifest
  (``source.metadata.spaces``), so ``rlds export --to minari`` can write the same spaces back.

The package, one module per job: :mod:`~rlds_cli.formats.minari.layout`: where the files are,
``sniff``, ``source_files``, the default cache name; :mod:`~rlds_cli.formats.minari.layout`:
``metadata.json`` and episode seeds; :mod:`~rlds_cli.formats.minari.layout`: spaces, their leaves
and JPEG frames; :mod:`~rlds_cli.formats.minari.layout`: the storage plug point;
:mod:`~rlds_cli.formats.minari.hdf5_store` and :mod:`~rlds_cli.formats.minari.arrow_store`: the
storages; :mod:`~rlds_cli.formats.minari.reader`: :class:`MinariReader` (episodes -> TED blocks).
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
