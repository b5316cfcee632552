"""RLDS / Open X-Embodiment datasets in TFDS's TFRecord layout, read without TensorFlow.

A dataset version folder (``gs://gresearch/robotics/<dataset>/<version>/``) holds
``features.json`` (the TFDS feature tree, :mod:`rlds_cli.formats.tfds_features`),
``dataset_info.json`` (name, version, splits, records per shard) and shards
``<name>-<split>.tfrecord-00000-of-000NN``. Each record is one ``tf.train.Example`` per
**episode** (:mod:`rlds_cli.formats.tfrecord_io`): ``steps/<path>`` features hold the ``T``
steps flattened along time, ``episode_metadata/<path>`` one value per episode. Rules
(``rlds-tfrecord-v1``; ``docs/formats.md``, "RLDS / Open X-Embodiment"):

* **Keys.** ``steps/observation/<k>`` -> ``observation/<k>`` (flat, stored once; a single tensor
  ``steps/observation`` -> ``observation``); ``steps/action`` -> ``action`` (dict:
  ``action/<k>``); ``steps/reward`` -> ``next/reward``; ``is_first``, ``is_last``,
  ``is_terminal`` are consumed; other step features ``steps/<p>`` (``discount``,
  ``language_embedding``...) -> ``info/<p>``, scalars with TED's trailing ``[1]``. Text
  (``language_instruction``) is stored as an int64 index ``<key>_index`` into a table of its
  distinct strings in ``source.metadata.rlds.text``. ``episode_metadata/<p>`` -> the per-episode
  source array ``rlds/episode_<p>`` (text: an index into ``source.metadata.rlds.episode_text``).
  Names go through :mod:`rlds_cli.formats.base`.
* **Images** (``Image`` features, PNG or JPEG) are decoded with Pillow to ``uint8`` HWC (a
  single-channel ``uint16`` PNG to ``uint16``), converted to the declared channel count as
  TensorFlow's decoder does.
* **The last step.** Strict RLDS puts only the final observation on the ``is_last`` step; many
  OXE datasets put a real action and reward there. ``last_step="auto"`` (default): a last step
  whose action and reward are all zero is the final observation only (``T - 1`` transitions,
  ``final_known = true``); otherwise it is a transition whose next observation is unknown (``T``
  transitions, final observation repeated, ``final_known = false``). ``"observation"`` and
  ``"transition"`` force either. The episode ends **terminated** when the last step's
  ``is_terminal`` is set, else **truncated**.
* **Checks.** Both CRCs of every record; every feature's value count against ``features.json``
  (``T * prod(shape)``); ``is_first`` only on step 0, ``is_last``/``is_terminal`` only on the last
  step; every shard of a split present, with the records ``dataset_info.json`` gives it.
* **Streaming and workers.** The main process walks the shards in order, checking framing and
  cutting each episode into pieces of about :data:`UNIT_BYTES` of decoded steps; worker processes
  (``workers``) decode pieces from memory-mapped records, and the main process packs them in shard
  order: output identical for any number of workers, memory bounded by a few pieces.

Modules: :mod:`.decode` (features.json -> TED columns, record checks, worker-side decoding) and
:mod:`.reader` (files, shards, splits; :class:`RldsTFRecordReader`: metadata, shard selection and
scan, pieces, flag checks, the last-step rule, the block stream).
"""

from rlds_cli.formats.base import BLOCK_BYTES
from rlds_cli.formats.rlds_tfrecord.decode import decode_unit
from rlds_cli.formats.rlds_tfrecord.reader import (
    FEATURES_FILE,
    INFO_FILE,
    LAST_STEP_RULES,
    RULES,
    UNIT_BYTES,
    RldsOptions,
    RldsTFRecordReader,
    sniff,
    source_files,
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
