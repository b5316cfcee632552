"""RLDS / Open X-Embodiment datasets in TFDS's TFRecord layout, read without TensorFlow.

A dataset version folder (``gs://gresearch/robotics/<dataset>/<version>/``) holds
``features.json`` (the TFDS feature tree: shapes, dtypes, image encodings; parsed by
:mod:`rlds_cli.formats.tfds_features`), ``dataset_info.json`` (name, version, splits and records
per shard) and shards ``<name>-<split>.tfrecord-00000-of-000NN``. Each record is one
``tf.train.Example`` per **episode** (framing and wire format: :mod:`rlds_cli.formats.tfrecord_io`):
``steps/<path>`` features hold the episode's ``T`` steps flattened along time,
``episode_metadata/<path>`` one value per episode.
The rules below are written out in ``docs/formats.md`` ("RLDS / Open X-Embodiment"), rules
``rlds-tfrecord-v1``:

* **Keys.** ``steps/observation/<k>`` becomes ``observation/<k>`` (flat, stored once; a single
  tensor ``steps/observation`` becomes ``observation``); ``steps/action`` becomes ``action`` (a
  dict action ``action/<k>``); ``steps/reward`` becomes ``next/reward``; ``is_first``,
  ``is_last`` and ``is_terminal`` are consumed; every other step feature ``steps/<p>``
  (``discount``, ``language_embedding``...) becomes ``info/<p>``, scalars with TED's trailing
  ``[1]``. Text (``language_instruction``) is stored as an int64 index, ``<key>_index``, into a
  table of its distinct strings in ``source.metadata.rlds.text``. ``episode_metadata/<p>``
  becomes the per-episode source array ``rlds/episode_<p>`` (text: an index into
  ``source.metadata.rlds.episode_text``). Names go through the key cleaner of every reader.
* **Images** (``Image`` features, PNG or JPEG) are decoded with Pillow to ``uint8`` HWC (a
  single-channel ``uint16`` PNG to ``uint16``), converted to the declared channel count as
  TensorFlow's decoder does.
* **The last step.** Strict RLDS puts only the final observation on an episode's ``is_last``
  step (its action and reward mean nothing); many OXE datasets put a real action and reward
  there. ``last_step="auto"`` (default): when the last step's action and reward are all zero it
  is the final observation only (``T - 1`` transitions, ``final_known = true``); otherwise it is
  kept as a transition whose next observation is unknown (``T`` transitions, the final
  observation repeats the last one, ``final_known = false``). ``"observation"`` and
  ``"transition"`` force either. The episode ends **terminated** when the last step's
  ``is_terminal`` is set, **truncated** otherwise.
* **Checks.** Both CRCs of every record; every feature's value count against ``features.json``
  (``T * prod(shape)``); ``is_first`` set only on step 0 and ``is_last``/``is_terminal`` only on
  the last step (an episode per record); every shard of a split present, with the records
  ``dataset_info.json`` gives it.
* **Streaming and workers.** The main process walks the shards in order, checking the framing
  and planning each episode as pieces of about :data:`UNIT_BYTES` of decoded steps; worker
  processes (the ``workers`` option) decode the pieces from memory-mapped records and the main
  process packs them into blocks in shard order, so the output is identical for any number of
  workers and memory is bounded by a few pieces, never by a shard or an episode.

The package, by responsibility: :mod:`.layout` (the folder's files, shards and splits),
:mod:`.decode` (features.json mapped to TED columns, each record checked against them, the
worker-side decoding of a piece) and :mod:`.reader` (:class:`RldsTFRecordReader`: metadata,
shard selection, the shard scan and the pieces for the workers, the flag checks and the last-step
rule, the block stream).
"""

from rlds_cli.formats.packing import BLOCK_BYTES
from rlds_cli.formats.rlds_tfrecord.decode import decode_unit
from rlds_cli.formats.rlds_tfrecord.layout import FEATURES_FILE, INFO_FILE, sniff, source_files
from rlds_cli.formats.rlds_tfrecord.reader import (
    LAST_STEP_RULES,
    RULES,
    UNIT_BYTES,
    RldsOptions,
    RldsTFRecordReader,
)

__all__ = [
    "BLOCK_BYTES",
    "FEATURES_FILE",
    "INFO_FILE",
    "LAST_STEP_RULES",
    "RULES",
    "UNIT_BYTES",
    "RldsOptions",
    "RldsTFRecordReader",
    "decode_unit",
    "sniff",
    "source_files",
]
