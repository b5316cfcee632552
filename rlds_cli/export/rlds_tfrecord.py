"""Export to an RLDS dataset in TFDS's TFRecord layout (what ``tfds.builder_from_directory`` loads,
and Octo / OpenVLA train on), written without TensorFlow.

Files: ``features.json``, ``dataset_info.json`` and shards ``<name>-train.tfrecord-00000-of-0000N``,
one ``tf.train.Example`` per episode. The framing, the ``Example`` encoding, the feature nodes and
the shard names are those rlds's RLDS reader reads (:mod:`rlds_cli.formats.tfrecord_io`,
:mod:`rlds_cli.formats.tfds_features`, :mod:`rlds_cli._util.tfds_layout`).

The rules (written out in ``docs/formats.md``, "Export to RLDS"):

* **Steps.** ``steps`` is RLDS's ``Dataset`` feature: ``observation`` (a plain ``observation`` key
  is the tensor ``steps/observation``, ``observation/<k>`` is ``steps/observation/<k>``), ``action``
  (or ``action/<k>``), ``reward`` (``next/reward``), ``discount`` (``info/discount``, else 1.0),
  ``is_first``, ``is_last``, ``is_terminal``, and ``info/<p>`` as ``steps/<p>``. Scalars (TED's
  trailing ``[1]``) are ``Scalar`` features. A dataset converted from RLDS gets its source's feature
  names back (``source.metadata.rlds.keys``), its text features (``language_instruction``) written
  as ``Text`` from the kept string tables, and its ``episode_metadata``; any other dataset with
  language instructions (:attr:`~rlds_cli.cache.dataset.Dataset.instructions`: a LeRobot source's
  tasks, beside ``task_index``; RoboCasa's ``lang``; LIBERO's ``problem_info``) gets them as
  ``language_instruction``.
* **The last step.** An episode whose final observation is known is written as strict RLDS:
  ``T + 1`` steps, the last one holding the final observation with a zero action and reward
  (``is_last``; ``is_terminal`` when the episode terminated). One whose final observation is unknown
  (a synthesized one) is written as its ``T`` transitions, the last one ``is_last``, as many Open
  X-Embodiment datasets are. Each episode says which in
  ``episode_metadata/last_step_is_observation``, which rlds's reader follows.
* **Dtypes.** Integers and bools are ``int64_list`` (``uint64`` bit-cast), ``float16`` and
  ``float32`` ``float_list``; ``float64`` tensors are stored as their raw bytes (TFDS's
  ``encoding: bytes``), since a ``float_list`` would round them to float32.
* **Images.** A camera frame column of the cache stored as JPEG or PNG files (HWC) is written as an
  ``Image`` feature of that codec with the stored bytes, none decoded or encoded again. Other
  ``uint8`` observations shaped ``(H, W, C)`` with ``C`` 1, 3 or 4 (and frame columns of another
  codec) are encoded with ``image_codec``: ``"png"`` (default, lossless), ``"jpeg"`` (quality 95,
  lossy; 4-channel images stay PNG) or ``"none"`` (raw ``uint8`` tensors). Channels-first and 2-D
  frames are written as ``uint8`` tensors.
* **Shards.** Episodes go into shards of about :data:`SHARD_BYTES` each, in order; split ``train``;
  ``dataset_info.json`` gives each shard's episodes (``shardLengths``).

Memory holds one episode's ``Example`` at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.cpus import usable_cpus
from rlds_cli._util.tfds_layout import FEATURES_FILE, FILEPATH_TEMPLATE, INFO_FILE, shard_name
from rlds_cli.cache.dataset import Dataset, Instructions
from rlds_cli.errors import ExportError, MissingExtraError, import_extra
from rlds_cli.export import atomic_target, flat_keys, refuse_complex, step_keys
from rlds_cli.formats.rlds_tfrecord.decode import LAST_STEP_FEATURE
from rlds_cli.formats.tfds_features import dict_node, image_node, steps_node, tensor_node, text_node
from rlds_cli.formats.tfrecord_io import (
    BYTES_LIST,
    FLOAT_LIST,
    INT64_LIST,
    encode_example,
    encode_feature,
    frame_record,
    have_crc32c,
)
from rlds_cli.frames.codecs import FrameFormat, encode

#: Bytes of records after which a shard is closed and the next one begun.
SHARD_BYTES = 256 << 20
IMAGE_CODECS = ("png", "jpeg", "none")
#: JPEG quality of ``image_codec="jpeg"``.
JPEG_QUALITY = 95
SPLIT = "train"
VERSION = "1.0.0"
_FLAGS = ("is_first", "is_last", "is_terminal")
_RESERVED = {"steps/reward", "steps/discount", *(f"steps/{f}" for f in _FLAGS)}
_EXTRA_HINT = "pip install 'rlds-cli[rlds]' (crc32c and pillow)"


@dataclass
class _Leaf:
    """One feature of ``steps``: the TED key it comes from and how it is written."""

    name: str  # in the Example: "steps/observation/image"
    key: str  # the TED key
    flat: bool  # an observation (T + 1 rows)
    node: dict[str, Any]
    kind: str  # "tensor", "bytes" (raw-bytes tensor), "image", "text", "stored" (kept image files)
    codec: str = ""
    texts: list[str] | None = None


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict (a manifest's metadata), else an empty one."""
    return value if isinstance(value, dict) else {}


def _tfds_name(name: str) -> str:
    """The dataset's name as a TFDS name (lower case, ``_`` for anything but letters and digits)."""
    cleaned = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    return cleaned or "dataset"


def _default_name(key: str, flat: bool) -> str:
    if flat:
        return "steps/" + (key if key.startswith("observation") else f"observation/{key}")
    if key == "next/reward":
        return "steps/reward"
    return "steps/" + (key.removeprefix("info/") if key.startswith("info/") else key)


def _image_shape(shape: tuple[int, ...]) -> bool:
    return len(shape) == 3 and shape[2] in (1, 3, 4) and shape[0] > 0 and shape[1] > 0


def _numeric_node(shape: tuple[int, ...], dtype: np.dtype) -> tuple[dict[str, Any], str]:
    if dtype == np.float64:
        return tensor_node(shape, dtype.name, encoding="bytes"), "bytes"
    return tensor_node(shape, dtype.name), "tensor"


class _Plan:
    """What the export writes: the step leaves, the episode leaves, the feature tree."""

    def __init__(self, dataset: Dataset, image_codec: str) -> None:
        fields = dataset.stored_fields
        refuse_complex(dataset, "an RLDS TFRecord")
        meta = _mapping(dataset.source_metadata)  # a view's are its parent's
        rlds = _mapping(meta.get("rlds"))
        back = {str(v): str(k) for k, v in _mapping(rlds.get("keys")).items()}  # TED key -> source name
        texts = dataset.text_tables
        self.leaves: list[_Leaf] = []
        for key in flat_keys(dataset):
            self.leaves.append(self._leaf(dataset, key, True, back, texts, image_codec))
        for key in ["action", *step_keys(dataset)]:
            if key in fields and key not in ("next/terminated", "next/truncated"):
                self.leaves.append(self._leaf(dataset, key, False, back, texts, image_codec))
        for key in [k for k in fields if k.startswith("action/")]:
            if not any(leaf.key == key for leaf in self.leaves):
                self.leaves.append(self._leaf(dataset, key, False, back, texts, image_codec))
        if "next/reward" in fields and not any(leaf.key == "next/reward" for leaf in self.leaves):
            self.leaves.append(self._leaf(dataset, "next/reward", False, back, texts, image_codec))
        found = dataset.instructions
        if found is not None and found.maps:  # a merge's index column: each part's own table's
            self.leaves = [leaf for leaf in self.leaves if leaf.key != found.step_key]
        names = [leaf.name for leaf in self.leaves]
        self.instructions = self._instructions(dataset, names)
        self.discount = "steps/discount" not in names
        clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(self._fixed())))
        under = sorted((b, a) for a in names for b in names if b.startswith(a + "/"))
        if under:  # a feature cannot hold both a tensor and features below it
            below, tensor = under[0]
            key = {leaf.name: leaf.key for leaf in self.leaves}.get(below, below)
            raise ExportError(
                f"{dataset.name}: the RLDS feature {below} (key {key!r}) would lie under the tensor "
                f"feature {tensor}",
                hint="rename the keys (rlds preprocess) before exporting, e.g. 'observation' to "
                "'observation/state'",
            )
        if clash:
            raise ExportError(
                f"{dataset.name}: keys map to the RLDS features {', '.join(clash)} twice (or onto a "
                "feature RLDS reserves)",
                hint="rename the keys (rlds preprocess) before exporting",
            )
        self.episode = self._episode_leaves(dataset, rlds, back)

    def _fixed(self) -> list[str]:
        fixed = [f"steps/{f}" for f in _FLAGS]
        if self.discount:
            fixed.append("steps/discount")
        if self.instructions is not None:
            fixed.append("steps/language_instruction")
        return fixed

    def _leaf(
        self,
        dataset: Dataset,
        key: str,
        flat: bool,
        back: dict[str, str],
        texts: dict[str, Any],
        image_codec: str,
    ) -> _Leaf:
        spec = dataset.stored_fields[key]
        name = back.get(key, "")
        if not name.startswith("steps/"):
            name = _default_name(key, flat)
        if not flat and name in _RESERVED and not (key == "next/reward" or key == "info/discount"):
            raise ExportError(
                f"{dataset.name}: key {key!r} would be written as {name!r}, which RLDS reserves"
            )
        table = texts.get(key)
        if isinstance(table, list) and np.dtype(spec.dtype).kind in "iu":
            return _Leaf(name, key, flat, text_node(), "text", texts=[str(t) for t in table])
        shape = tuple(spec.shape)
        if not flat and shape == (1,) and not key.startswith("action"):
            shape = ()  # TED's trailing axis of scalars: a Scalar feature (the reader adds it back)
        dtype = np.dtype(spec.dtype)
        fmt = spec.frame_format
        if flat and fmt is not None and fmt.codec in ("jpeg", "png") and not fmt.channels_first:
            column = dataset.column(key)
            # a view's, merge's or growing dataset's frames too, where its parts give them as stored
            if len(shape) == 3 and getattr(column, "stored_format", None) == fmt:
                return _Leaf(name, key, flat, image_node(fmt.image_shape, fmt.codec), "stored", fmt.codec)
        if flat and dtype == np.uint8 and image_codec != "none" and _image_shape(shape):
            codec = "png" if image_codec == "png" or shape[2] == 4 else "jpeg"
            return _Leaf(name, key, flat, image_node((shape[0], shape[1], shape[2]), codec), "image", codec)
        node, kind = _numeric_node(shape, dtype)
        return _Leaf(name, key, flat, node, kind)

    def _instructions(self, dataset: Dataset, names: list[str]) -> Instructions | None:
        """The dataset's language instructions, to write as ``steps/language_instruction``
        (``None``: none, or a text leaf already writes them)."""
        found = dataset.instructions
        if found is None or "steps/language_instruction" in names:
            return None
        if any(leaf.kind == "text" and leaf.key == found.step_key for leaf in self.leaves):
            return None
        return found

    @staticmethod
    def _episode_leaves(dataset: Dataset, rlds: dict[str, Any], back: dict[str, str]) -> list[_Leaf]:
        """A dataset converted from RLDS: its ``episode_metadata`` (kept as source arrays)."""
        arrays = dataset.episode_source_arrays() if back else {}
        texts = _mapping(rlds.get("episode_text"))
        out: list[_Leaf] = []
        for key, values in arrays.items():
            name = back.get(key, "")
            if not name.startswith("episode_metadata/") or name == LAST_STEP_FEATURE:
                continue
            if len(values) != dataset.num_episodes:  # a view of some of the source's episodes
                continue
            table = texts.get(key)
            if isinstance(table, list):
                out.append(_Leaf(name, key, False, text_node(), "text", texts=[str(t) for t in table]))
            else:
                node, kind = _numeric_node(tuple(values.shape[1:]), values.dtype)
                out.append(_Leaf(name, key, False, node, kind))
        return out

    def features(self) -> dict[str, Any]:
        """``features.json``'s tree."""
        step: dict[str, Any] = {}
        for leaf in self.leaves:
            _place(step, leaf.name.split("/")[1:], leaf.node)
        for flag in _FLAGS:
            step[flag] = tensor_node((), "bool")
        if self.discount:
            step["discount"] = tensor_node((), "float32", doc="Discount if provided, default to 1.")
        if self.instructions is not None:
            step["language_instruction"] = text_node("Language Instruction.")
        top: dict[str, Any] = {"steps": steps_node(_nest(step))}
        meta: dict[str, Any] = {LAST_STEP_FEATURE.split("/")[1]: tensor_node((), "bool")}
        for leaf in self.episode:
            _place(meta, leaf.name.split("/")[1:], leaf.node)
        top["episode_metadata"] = _nest(meta)
        return _nest(top)


def _place(tree: dict[str, Any], parts: list[str], node: dict[str, Any]) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = node


def _nest(tree: dict[str, Any]) -> dict[str, Any]:
    """Plain dicts of ``tree`` made ``FeaturesDict`` nodes (leaves carry ``pythonClassName``)."""
    if "pythonClassName" in tree:
        return tree
    return dict_node({k: _nest(v) for k, v in sorted(tree.items())})


def _values(leaf: _Leaf, rows: Any, fmt: FrameFormat | None) -> bytes:
    """One leaf's rows as a serialized ``Feature``."""
    if leaf.kind == "stored":
        return encode_feature(BYTES_LIST, rows)
    if leaf.kind == "text":
        assert leaf.texts is not None
        table = leaf.texts
        index = np.asarray(rows).reshape(-1)
        if len(index) and (index.min() < 0 or index.max() >= len(table)):
            raise ExportError(f"{leaf.key!r} holds a text index outside its table of {len(table)} strings")
        return encode_feature(BYTES_LIST, [table[i].encode("utf-8") for i in index.tolist()])
    values = np.asarray(rows)
    if leaf.kind == "image":
        assert fmt is not None
        # Pillow and simplejpeg release the GIL while they encode: the episode's frames on every core
        with ThreadPoolExecutor(max_workers=usable_cpus()) as pool:
            files = list(pool.map(lambda frame: encode(frame, fmt, JPEG_QUALITY), values))
        return encode_feature(BYTES_LIST, files)
    if leaf.kind == "bytes":
        little = values.astype(values.dtype.newbyteorder("<"), copy=False)
        return encode_feature(BYTES_LIST, [row.tobytes() for row in little])
    if values.dtype.kind == "f":
        return encode_feature(FLOAT_LIST, values.reshape(-1))
    if values.dtype == np.uint64:
        values = values.view(np.int64)
    return encode_feature(INT64_LIST, values.reshape(-1))


def _with_last(rows: np.ndarray, zero: bool) -> np.ndarray:
    """``rows`` and one more row: zeros (action, reward) or a repeat of the last (other values)."""
    extra = np.zeros_like(rows[-1:]) if zero else rows[-1:]
    return np.concatenate([rows, extra])


class _Shards:
    """Records written to numbered temporary files, renamed to TFDS's names once all are known."""

    def __init__(self, folder: Path, shard_bytes: int) -> None:
        self.folder = folder
        self.limit = shard_bytes
        self.lengths: list[int] = []
        self.sizes: list[int] = []
        self.fh: Any = None

    def add(self, record: bytes) -> None:
        if self.fh is None or self.sizes[-1] >= self.limit:
            self.close()
            self.fh = open(self.folder / f".shard-{len(self.lengths)}", "wb")  # noqa: SIM115
            self.lengths.append(0)
            self.sizes.append(0)
        self.fh.write(record)
        self.lengths[-1] += 1
        self.sizes[-1] += len(record)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def publish(self, name: str) -> list[str]:
        self.close()
        count = len(self.lengths)
        names = [shard_name(name, SPLIT, i, count) for i in range(count)]
        for i, final in enumerate(names):
            (self.folder / f".shard-{i}").rename(self.folder / final)
        return names


def export_rlds(
    dataset: Dataset,
    out: Path,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    image_codec: str = "png",
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Write ``dataset`` as an RLDS TFRecord dataset folder at ``out`` (see the module docstring).

    Args:
        image_codec: ``"png"``, ``"jpeg"`` or ``"none"``: how image-like ``uint8`` observations
            not already stored as JPEG/PNG files are written.
        shard_bytes: Bytes of records per shard (about).

    Returns:
        ``out``.
    """
    if image_codec not in IMAGE_CODECS:
        raise ExportError(
            f"image_codec is {image_codec!r}; RLDS exports take {', '.join(IMAGE_CODECS)}",
            hint=f"pass --image-codec {IMAGE_CODECS[0]} (lossless), or leave it out",
        )
    if not have_crc32c():
        raise MissingExtraError(
            "TFRecord checksums need a crc32c package, which is not installed", hint=_EXTRA_HINT
        )
    plan = _Plan(dataset, image_codec)
    if any(leaf.kind == "image" for leaf in plan.leaves):
        import_extra("PIL.Image", "encoding RLDS images", hint=_EXTRA_HINT, package="Pillow")
    name = _tfds_name(dataset.name)
    formats = {
        leaf.key: FrameFormat(leaf.codec, tuple(dataset.stored_fields[leaf.key].shape))
        for leaf in plan.leaves
        if leaf.kind == "image"
    }
    columns = {leaf.key: dataset.column(leaf.key) for leaf in plan.leaves}
    columns["next/terminated"] = dataset.column("next/terminated")
    episode_values = dataset.episode_source_arrays() if plan.episode else {}
    with atomic_target(out, overwrite=overwrite, folder="dataset_info.json") as tmp:
        tmp.mkdir()
        shards = _Shards(tmp, max(1, int(shard_bytes)))
        try:
            for e in range(dataset.num_episodes):
                record = _episode(dataset, plan, columns, formats, episode_values, e)
                shards.add(frame_record(record))
                if progress is not None:
                    progress(int(dataset.episode_index["length"][e]))
            names = shards.publish(name)
        finally:
            shards.close()
        (tmp / FEATURES_FILE).write_text(json.dumps(plan.features(), indent=4))
        info = {
            "description": f"{dataset.name}, exported by rlds (rlds export --to rlds).",
            "fileFormat": "tfrecord",
            "moduleName": __name__,
            "name": name,
            "splits": [
                {
                    "filepathTemplate": FILEPATH_TEMPLATE,
                    "name": SPLIT,
                    "numBytes": str(sum(shards.sizes)),
                    "shardLengths": [str(n) for n in shards.lengths],
                }
            ],
            "version": VERSION,
        }
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
        assert len(names) == len(shards.lengths)
    return out


def _episode(
    dataset: Dataset,
    plan: _Plan,
    columns: dict[str, Any],
    formats: dict[str, FrameFormat],
    episode_values: dict[str, np.ndarray],
    e: int,
) -> bytes:
    """Episode ``e`` as a serialized ``Example``."""
    start = int(dataset.episode_index["start"][e])
    length = int(dataset.episode_index["length"][e])
    known = bool(dataset.episode_index["final_known"][e])
    written = length + 1 if known else length
    rows = slice(start, start + length)
    flat = slice(start + e, start + e + written)  # each earlier episode adds a final obs
    feats: dict[str, bytes] = {}
    for leaf in plan.leaves:
        column = columns[leaf.key]
        if leaf.kind == "stored":
            encoded = column.encoded_rows(np.arange(flat.start, flat.stop, dtype=np.int64))
            feats[leaf.name] = _values(leaf, encoded.data, None)
            continue
        values = np.asarray(column[flat] if leaf.flat else column[rows])
        if known and not leaf.flat:
            zero = leaf.key == "next/reward" or leaf.key == "action" or leaf.key.startswith("action/")
            values = _with_last(values, zero)
        feats[leaf.name] = _values(leaf, values, formats.get(leaf.key))
    term = np.asarray(columns["next/terminated"][start + length - 1]).any()
    first = np.zeros(written, bool)
    first[0] = True
    last = np.zeros(written, bool)
    last[-1] = True
    feats["steps/is_first"] = encode_feature(INT64_LIST, first)
    feats["steps/is_last"] = encode_feature(INT64_LIST, last)
    feats["steps/is_terminal"] = encode_feature(INT64_LIST, last & bool(term))
    if plan.discount:
        feats["steps/discount"] = encode_feature(FLOAT_LIST, np.ones(written, np.float32))
    if plan.instructions is not None:
        index = plan.instructions.of_steps(dataset, e, rows)
        if known:
            index = np.concatenate([index, index[-1:]])
        task_leaf = _Leaf("steps/language_instruction", "", False, {}, "text", texts=plan.instructions.texts)
        feats["steps/language_instruction"] = _values(task_leaf, index, None)
    feats[LAST_STEP_FEATURE] = encode_feature(INT64_LIST, [int(known)])
    for leaf in plan.episode:
        feats[leaf.name] = _values(leaf, episode_values[leaf.key][e : e + 1], None)
    return encode_example(feats)
