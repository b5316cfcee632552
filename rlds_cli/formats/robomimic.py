"""robomimic HDF5 files, and those in its layout (LIBERO, RoboCasa, MimicGen), metadata kept.

The layout (robomimic's ``dataset_states_to_obs.py``, LIBERO's ``create_dataset.py``):
``data/demo_<N>/{actions, rewards, dones, states, obs/<k>, next_obs/<k>}`` with ``T`` rows each,
per-demo attributes ``num_samples`` (= ``T``) and ``model_file``, ``data`` attributes
``env_args`` (JSON) and ``total``, and filter keys ``mask/<key>`` (arrays of demo names). Rules
(``docs/formats.md``):

* Demos are read in robomimic's order, by the number after ``demo_`` (what ``SequenceDataset``
  sorts by), which is the episode's source id. A group under ``data`` not named ``demo_<N>`` is
  refused, as robomimic would fail on it.
* Step ``t`` is ``(obs[t], actions[t]) -> next_obs[t]`` with reward ``rewards[t]``; ``obs/<k>``
  is ``observation/<k>``. ``next_obs`` must equal ``obs`` one row later (robomimic copies it so);
  its last row is the real final observation. Without ``next_obs`` (LIBERO,
  ``--exclude-next-obs``) the final observation repeats the last one, ``final_known = false``.
* ``dones`` is kept as ``info/dones`` (``done_mode`` 0 and 2 set it mid-demo on success states);
  a demo ends terminated when its last ``dones`` is set, else truncated.
* Every other dataset of a demo (``states``, LIBERO's ``robot_states``, ``actions_abs``,
  ``action_dict/<k>``) is ``info/<name>`` as stored; text datasets are dropped with a note.
* Long demos are read in pieces of about :data:`~rlds_cli.formats.base.BLOCK_BYTES`.

**Metadata**, read once while planning:

* ``data`` attributes: all in the manifest (``source.metadata.robomimic.attrs``; arrays as
  lists). The JSON strings ``env_args`` (robomimic, LIBERO) and ``problem_info`` (LIBERO) are
  also kept parsed; LIBERO's ``problem_info.language_instruction`` is ``language_instruction``.
* Per-demo attributes, one row per episode in ``source_metadata.npz`` (read back by
  :meth:`rlds_cli.cache.dataset.Dataset.episode_metadata`): text (``model_file``, RoboCasa's
  ``ep_meta``, ``camera_info``) as ``robomimic/episode_<attr>`` ``[start, stop)`` byte ranges into
  ``robomimic/text/<attr>`` (UTF-8, each distinct text once; ``-1`` where a demo has none);
  numbers (``num_samples``, LIBERO's ``init_state``) as ``robomimic/episode_<attr>``. RoboCasa's
  ``ep_meta["lang"]`` is also ``robomimic/episode_lang``.
* Filter keys: names in ``source.metadata.filter_keys``; per episode, which keys hold it
  (``filter_keys/episode_member``, bool, one column per name), so they stay right after
  ``--episodes A:B``.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.layout import FILTER_KEYS, MEMBER_ARRAY
from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Piece,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    is_text,
    renamed_note,
    rows_per_block,
    text_note,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.hdf5_util import (
    ChunkRows,
    damage_named,
    hdf5_top_keys,
    inflatable,
    is_hdf5_name,
    open_hdf5,
    read_error,
    read_rows,
    to_jsonable,
    unwritten_chunks,
)
from rlds_cli.formats.untrusted import check_side_array, require_numeric, require_rows

#: The JSON attributes of ``data`` that are kept parsed too.
JSON_ATTRS = ("env_args", "problem_info")


def _text(value: Any) -> str | None:
    """An attribute as text (h5py gives ``str`` for variable-length strings, ``bytes`` for fixed-width),
    or ``None``."""
    if isinstance(value, str):  # a UTF-8 attribute of bytes that are not UTF-8 arrives with surrogates
        return value.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8", errors="replace")
    return None


def parse_json(value: Any) -> Any:
    """A JSON attribute parsed, or ``None`` when it is not valid JSON text."""
    text = _text(value)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None


@dataclass
class DemoTexts:
    """Per-episode text attributes, each distinct text stored once in a byte blob."""

    blobs: dict[str, bytearray] = field(default_factory=dict)
    seen: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def add(self, episode: int, attr: str, text: str | None) -> None:
        """Record ``text`` (``None``: the demo has none) for episode ``episode`` (once: one row each)."""
        rows = self.ranges.setdefault(attr, [])
        if len(rows) > episode:
            raise ValueError(f"attribute {attr!r} of episode {episode} recorded twice")
        rows.extend([(-1, -1)] * (episode - len(rows)))  # demos before that had none
        if text is None:
            rows.append((-1, -1))
            return
        seen = self.seen.setdefault(attr, {})
        span = seen.get(text)
        if span is None:
            blob = self.blobs.setdefault(attr, bytearray())
            raw = text.encode("utf-8")
            span = seen[text] = (len(blob), len(blob) + len(raw))
            blob += raw
        rows.append(span)

    def arrays(self, episodes: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for attr, rows in self.ranges.items():
            rows = rows + [(-1, -1)] * (episodes - len(rows))
            out[f"robomimic/episode_{attr}"] = np.asarray(rows, np.int64).reshape(-1, 2)
            out[f"robomimic/text/{attr}"] = np.frombuffer(bytes(self.blobs.get(attr, b"")), np.uint8)
        return out


@dataclass
class FileMeta:
    """What a robomimic file says besides its steps (see the module docstring)."""

    attrs: dict[str, Any]
    masks: dict[str, list[str]]
    notes: list[str]

    def manifest(self, episodes: int) -> dict[str, Any]:
        """The manifest's ``source.metadata``."""
        meta: dict[str, Any] = {"attrs": self.attrs, "episodes": episodes}
        for name in JSON_ATTRS:
            if name in self.attrs:
                parsed = parse_json(self.attrs[name])
                meta[name] = parsed if parsed is not None else self.attrs[name]
        info = meta.get("problem_info")
        if isinstance(info, dict) and isinstance(info.get("language_instruction"), str):
            meta["language_instruction"] = info["language_instruction"]
        return {"robomimic": meta, FILTER_KEYS: sorted(self.masks)}


def _contradicted_counts(attrs: dict[str, Any], demos: int, steps: int) -> list[str]:
    """Notes naming the ``data`` attributes whose counts the demos contradict (``total``: the
    steps, ``num_demos``: the demos); the demos are what is converted."""
    notes = []
    for name, held, what in (("total", steps, "steps"), ("num_demos", demos, "demos")):
        value = attrs.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value != held:
            notes.append(
                f"data@{name} says {value:,} {what}, the file's demos hold {held:,}: the demos are converted"
            )
    return notes


def read_file_meta(f: Any, path: Path, demos: Sequence[str]) -> FileMeta:
    """The ``data`` attributes and the filter keys of an open robomimic file.

    Raises:
        SourceFormatError: A ``mask/<key>`` that is not a 1-d array of demo names.
    """
    import h5py

    notes: list[str] = []
    attrs: dict[str, Any] = {}
    for name, value in f["data"].attrs.items():
        if isinstance(value, np.ndarray):
            check_side_array(path, f"data@{name}", value.shape, value.dtype)
        attrs[name] = to_jsonable(value)
    for name in JSON_ATTRS:
        if name in attrs and not isinstance(parse_json(attrs[name]), dict):
            notes.append(
                f"data@{name} is not a JSON object (robomimic writes json.dumps of a dict): kept as it is"
            )
    if "total" in attrs and (isinstance(attrs["total"], bool) or not isinstance(attrs["total"], int)):
        notes.append(f"data@total is {attrs['total']!r}, not a count of steps: kept as it is")
    masks: dict[str, list[str]] = {}
    known = set(demos)
    group = f.get("mask")
    if group is not None and not isinstance(group, h5py.Group):
        raise SourceFormatError(
            f"{path}: 'mask' is not a group of filter keys (robomimic writes mask/<key>, each a list of "
            "demo names)",
            hint="fix or delete 'mask' in the file",
        )
    if isinstance(group, h5py.Group):
        for key, node in group.items():
            if not isinstance(node, h5py.Dataset) or node.ndim != 1 or node.dtype.kind not in "SO":
                raise SourceFormatError(
                    f"{path}: filter key 'mask/{key}' is not a list of demo names "
                    f"(robomimic writes np.array(demo_keys, dtype='S'))",
                    hint="fix or delete that filter key in the file",
                )
            check_side_array(path, f"mask/{key}", node.shape, node.dtype)
            names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in node[()]]
            missing = [n for n in names if n not in known]
            if missing:
                notes.append(
                    f"filter key {key!r} names {len(missing)} demo(s) not in data/ "
                    f"({', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}); they are left out"
                )
            masks[key] = [n for n in names if n in known]
    return FileMeta(attrs, masks, notes)


@dataclass
class DemoMeta:
    """Per-demo attributes gathered episode by episode (see the module docstring)."""

    texts: DemoTexts = field(default_factory=DemoTexts)
    numbers: dict[str, list[np.ndarray]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    count: int = 0

    def add(self, group: Any, path: Path, name: str) -> None:
        """Record the attributes of demo group ``group`` as the next episode."""
        episode = self.count
        self.count += 1
        for attr, value in group.attrs.items():
            text = _text(value)
            if text is not None:
                self.texts.add(episode, attr, text)
                # RoboCasa: the task's language instruction (a demo's own lang attribute is kept instead)
                if attr == "ep_meta" and "lang" not in group.attrs:
                    meta = parse_json(text)
                    lang = meta.get("lang") if isinstance(meta, dict) else None
                    self.texts.add(episode, "lang", lang if isinstance(lang, str) else None)
                continue
            array = np.asarray(value)
            if array.dtype.kind not in "biuf" or attr in self.dropped:
                self.dropped.add(attr)
                continue
            check_side_array(path, f"data/{name}@{attr}", array.shape, array.dtype)
            rows = self.numbers.setdefault(attr, [])
            if len(rows) != episode or (
                rows and (rows[0].shape, rows[0].dtype) != (array.shape, array.dtype)
            ):
                self.dropped.add(attr)  # not in every demo, or of another shape: no per-episode array
                continue
            rows.append(array)

    def arrays(self) -> dict[str, np.ndarray]:
        out = self.texts.arrays(self.count)
        for attr, rows in self.numbers.items():
            if len(rows) != self.count:  # missing from the last demos
                self.dropped.add(attr)
            if attr not in self.dropped:
                out[f"robomimic/episode_{attr}"] = np.stack(rows)
        return out

    def notes(self) -> list[str]:
        gone = sorted(self.dropped)
        if not gone:
            return []
        return [f"per-demo attributes not kept (not text, nor numbers of one shape in every demo): {gone}"]


def membership(masks: dict[str, list[str]], demos: Sequence[str]) -> np.ndarray:
    """Per episode (``demos``, in episode order), which filter keys (sorted names) hold it."""
    names = sorted(masks)
    member = np.zeros((len(demos), len(names)), bool)
    position = {d: i for i, d in enumerate(demos)}
    for j, key in enumerate(names):
        for demo in masks[key]:
            if demo in position:
                member[position[demo], j] = True
    return member


_DEMO_RE = re.compile(r"demo_(\d+)")  # whole names only (fullmatch: '$' matched before a newline)
#: Bytes a block gathers: demos of at least this much go to the cache without the copy that joins
#: smaller ones (image demos are megabytes each).
_BLOCK_BYTES = 1 << 20
#: Datasets every demo must have (``obs`` is a group of them).
_REQUIRED = ("actions", "rewards", "dones")


def sniff(path: Path) -> bool:
    """Whether ``path`` is a robomimic file: an HDF5 file whose ``data`` group holds ``demo_*``
    groups."""
    if not is_hdf5_name(path) or "data" not in (hdf5_top_keys(path) or ()):
        return False
    import h5py

    try:
        with h5py.File(path, "r") as f, damage_named(path):
            data = f.get("data")
            return isinstance(data, h5py.Group) and any(k.startswith("demo_") for k in data)
    except OSError:
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The ``.hdf5``/``.h5`` files of a source (the reader takes one)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.is_file() and is_hdf5_name(q))
        else:
            out.append(p)
    return out


#: One dataset of a demo: its path below the demo, per-row shape and dtype.
Spec = tuple[tuple[int, ...], str]


@dataclass
class _Demo:
    name: str
    number: int
    length: int


def _native(dtype: Any) -> np.dtype:
    """``dtype`` in this machine's byte order (demos that differ in byte order alone hold the same
    values)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")


@dataclass(frozen=True)
class RobomimicOptions(ReaderOptions):
    """Options of :class:`RobomimicReader` (its keyword arguments)."""

    block_rows: int | None = None


class RobomimicReader(Reader):
    """Streams a robomimic-layout HDF5 file (robomimic, LIBERO, RoboCasa, MimicGen) as
    :class:`StepBlock` s, demo by demo in robomimic's order.

    Args:
        path: The ``.hdf5`` file.
        block_rows: Steps per block at most (default: about 8 MiB of data a block).
    """

    format_name = "robomimic"
    expected_files = "an .hdf5 file whose 'data' group holds demo_0, demo_1, ... groups"
    Options = RobomimicOptions
    reads_one_file = True
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(self, path: str | Path | Sequence[str | Path], *, block_rows: int | None = None) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.path = paths[0]
        self.block_rows = block_rows
        self.report = ConversionReport(rules="robomimic-v1")
        self._file = open_hdf5(self.path)
        self._chunk_rows = ChunkRows(threads=1)  # gzip chunks inflated at their exact size
        try:
            with damage_named(self.path):
                self._plan()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ planning

    def _plan(self) -> None:
        """The demos in robomimic's order and their rows; the first demo is checked whole, the others
        against it as they are read."""
        import h5py

        f, path = self._file, self.path
        data = f.get("data")
        if not isinstance(data, h5py.Group):
            raise SourceFormatError(f"{path} has no 'data' group; is it a robomimic-layout file?")
        numbered = []
        for name in data:
            m = _DEMO_RE.fullmatch(name)
            if m is None or not isinstance(data[name], h5py.Group):
                raise SourceFormatError(
                    f"{path}: {'data/' + name!r} is not a demo_<N> group (robomimic sorts demos by the "
                    "number after 'demo_' and reads nothing else under data/)",
                    hint="move or delete that entry of the file",
                )
            number = int(m.group(1))
            if number > np.iinfo(np.int64).max:  # the episode's source id is an int64
                raise SourceFormatError(
                    f"{path}: 'data/{name[:40]}...' has a demo number past 2**63 - 1, which rlds "
                    "keeps as the episode's source id",
                    hint="rename that demo (robomimic's writers number them from 0)",
                )
            numbered.append((number, name))
        if not numbered:
            raise SourceFormatError(f"{path}: 'data' holds no demo_<N> group")
        numbered.sort()
        for (a, first), (b, second) in itertools.pairwise(numbered):
            if a == b:  # demo_1 and demo_001: robomimic's order of the two is not defined
                raise SourceFormatError(
                    f"{path}: 'data/{first}' and 'data/{second}' have the same demo number ({a}), which "
                    "orders demos and is kept as the episode's source id",
                    hint="rename one of them",
                )
        self._data = data
        self._notes: list[str] = []
        self._schema: dict[str, Spec] = {}
        self._first_label = ""
        for _, name in numbered:  # the first demo with a step sets what every other must have
            if self._check_demo(name)[0]:
                break
        if not self._schema:
            raise SourceFormatError(f"{path}: no demo under 'data' has a step")
        self._check_next_obs(self._schema, self._first_label)
        self.demos: list[_Demo] = []
        for number, name in numbered:
            actions = data[name].get("actions")
            length = int(actions.shape[0]) if isinstance(actions, h5py.Dataset) and actions.shape else 0
            self.demos.append(_Demo(name, number, length))
        self._admitted: list[str] = []
        self._meta = DemoMeta()
        self._file_meta: FileMeta = read_file_meta(f, path, [d.name for d in self.demos])
        self._has_next = any(k.startswith("next_obs/") for k in self._schema)
        wanted: dict[str, tuple[str, ...]] = {}
        for key in self._schema:
            if key.startswith("obs/"):
                wanted[key] = ("observation", *key[len("obs/") :].split("/"))
            elif not key.startswith("next_obs/") and key not in ("actions", "rewards"):
                wanted[key] = ("info", *key.split("/"))
        self._keys = clean_keys(wanted)
        self.report.source_rows = sum(d.length for d in self.demos)
        self._notes += _contradicted_counts(self._file_meta.attrs, len(self.demos), self.report.source_rows)
        self.report.expected = {"num_episodes": len(self.demos)}
        renamed = renamed_note(self._keys, wanted)
        if renamed:
            self._notes.append(renamed)
        row_bytes = sum(
            int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in self._schema.values()
        )
        self._piece_rows = self.block_rows or rows_per_block(row_bytes)

    def _check_demo(self, name: str) -> tuple[int, dict[str, Any]]:
        """Check demo ``name`` against the layout and the first demo's datasets; returns its length and its
        datasets (h5py objects) by path."""
        import h5py

        group, label = self._data[name], f"{self.path}:data/{name}"
        nodes: dict[str, Any] = {}
        group.visititems(
            lambda key, node: nodes.__setitem__(key, node) if isinstance(node, h5py.Dataset) else None
        )
        for key in _REQUIRED:
            if key not in nodes:
                raise SourceFormatError(
                    f"{label} has no {key!r} dataset (a robomimic demo has {', '.join(_REQUIRED)}, obs/*)"
                )
        if not any(k.startswith("obs/") for k in nodes):
            raise SourceFormatError(
                f"{label} has no obs/ datasets: a states-only file (robomimic's raw demo.hdf5)",
                hint="extract observations first with robomimic's dataset_states_to_obs.py",
            )
        mine: dict[str, Spec] = {}
        length = int(nodes["actions"].shape[0]) if nodes["actions"].shape else 0
        for key, node in nodes.items():
            shape, dtype = tuple(node.shape or ()), node.dtype
            if is_text(dtype) and not key.startswith(("obs/", "next_obs/")) and key not in _REQUIRED:
                self._notes.append(text_note(f"data/<demo>/{key}", dtype))
                continue
            require_numeric(label, key, dtype)
            require_rows(label, key, shape)
            if key in ("rewards", "dones") and int(np.prod(shape[1:], dtype=np.int64)) != 1:
                raise SourceFormatError(  # a return summed over its columns, exports that failed
                    f"{label}: {key!r} must have one value per row, has shape {shape}",
                    hint="a robomimic demo has one reward and one done flag per step",
                )
            if shape[0] != length:
                raise SourceFormatError(
                    f"{label}: {key!r} has {shape[0]} rows, 'actions' has {length} "
                    "(rows must be time-aligned)"
                )
            mine[key] = (
                shape[1:],
                _native(dtype).str,
            )  # rows are read native (_read): byte order alone differs
            missing, expected = unwritten_chunks(node)
            if missing:
                self._notes.append(
                    f"data/{name}/{key}: {missing} of {expected} chunks are not stored; h5py (and "
                    f"robomimic) read them as the fill value {to_jsonable(node.fillvalue)!r}"
                )
        declared = group.attrs.get("num_samples")
        if declared is not None:
            values = np.asarray(declared).reshape(-1)
            whole = values.size == 1 and (
                values.dtype.kind in "iu" or (values.dtype.kind == "f" and float(values[0]).is_integer())
            )
            if not whole:
                raise SourceFormatError(
                    f"{label}: num_samples is {str(declared)[:40]!r}, not a count of steps "
                    "(robomimic writes the demo's steps as an integer)",
                    hint="the file is damaged; write num_samples again or re-download it",
                )
            if int(values[0]) != length:
                raise SourceFormatError(
                    f"{label}: num_samples is {int(values[0])} but 'actions' has "
                    f"{length} rows (robomimic indexes the demo by num_samples)",
                    hint="the file is damaged; write num_samples again or re-download it",
                )
        if length == 0:  # no data: its dtypes are whatever np.array([]) gave; it is dropped
            return length, nodes
        if not self._schema:
            self._schema, self._first_label = mine, label
        elif mine != self._schema:
            raise SourceFormatError(
                f"{label}: {_difference(mine, self._schema, self._first_label.rpartition(':')[2])}"
            )
        return length, nodes

    @staticmethod
    def _check_next_obs(schema: dict[str, Spec], label: str) -> None:
        obs = {k[len("obs/") :]: v for k, v in schema.items() if k.startswith("obs/")}
        nxt = {k[len("next_obs/") :]: v for k, v in schema.items() if k.startswith("next_obs/")}
        if nxt and nxt != obs:
            raise SourceFormatError(
                f"{label}: next_obs/ holds {sorted(nxt)}, obs/ holds {sorted(obs)} (with shapes and dtypes); "
                "robomimic writes the same keys in both",
                hint="the file is damaged; extract it again with dataset_states_to_obs.py",
            )

    # ------------------------------------------------------------------ the Reader API

    def total_rows(self) -> int:
        return self.report.source_rows

    def source_metadata(self) -> dict[str, Any]:
        return self._file_meta.manifest(len(self._admitted))

    def source_arrays(self) -> dict[str, np.ndarray]:
        arrays = self._meta.arrays()
        arrays[MEMBER_ARRAY] = membership(self._file_meta.masks, self._admitted)
        return arrays

    def close(self) -> None:
        self._chunk_rows.close()
        self._file.close()

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield every demo in robomimic's order, in pieces of bounded size, each checked against the first
        demo's datasets as it is read."""
        packer = BlockPacker(self.block_rows, block_bytes=_BLOCK_BYTES)
        for demo in self.demos:
            with damage_named(self.path):
                length, nodes = self._check_demo(demo.name)
                if length == 0:
                    self.report.dropped_episodes += 1
                    continue
                self._admitted.append(demo.name)
                self._meta.add(self._data[demo.name], self.path, demo.name)
            for a in range(0, length, self._piece_rows):
                b = min(length, a + self._piece_rows)
                yield from packer.add(self._piece(demo, nodes, a, b))
                if progress is not None:
                    progress(b - a)
            self._chunk_rows.forget(nodes.values())  # each demo has datasets of its own
        yield from packer.finish()
        self.report.notes += list(dict.fromkeys(self._notes)) + self._file_meta.notes + self._meta.notes()
        if self.report.dropped_episodes:
            self.report.notes.append(f"{self.report.dropped_episodes} demo(s) with no step dropped")
        if not self._has_next:
            self.report.synthesized_final_observations = len(self._admitted)
            self.report.notes.append(
                "the file has no next_obs: each demo's next observation is the following step's, and its "
                "final observation is unknown (it repeats the last one, final_known = false)"
            )

    def _read(self, nodes: dict[str, Any], demo: _Demo, key: str, a: int, b: int) -> np.ndarray:
        node = nodes[key]
        try:
            rows = read_rows(self._chunk_rows, node, a, b, inflated=inflatable(node))
        except (OSError, RuntimeError) as exc:
            raise read_error(self.path, f"data/{demo.name}/{key}", exc) from exc
        return rows if rows.dtype.isnative else rows.astype(_native(rows.dtype))

    def _piece(self, demo: _Demo, nodes: dict[str, Any], a: int, b: int) -> Piece:
        """Steps ``[a, b)`` of ``demo`` (with its final observation when ``b`` is its end)."""
        last = b == demo.length
        label = f"{self.path}:data/{demo.name}"
        observations: dict[str, np.ndarray] = {}
        steps: dict[str, np.ndarray] = {"action": self._read(nodes, demo, "actions", a, b)}
        steps["next/reward"] = _column(self._read(nodes, demo, "rewards", a, b))
        for key, ted in self._keys.items():
            if not key.startswith("obs/"):
                steps[ted] = self._read(nodes, demo, key, a, b)
                continue
            name = key[len("obs/") :]
            rows = self._read(nodes, demo, key, a, min(b + 1, demo.length))  # one more: the next step's
            if self._has_next:
                nxt = self._read(nodes, demo, f"next_obs/{name}", a, b)
                _check_continuity(label, name, a, rows[1:], nxt[: len(rows) - 1])
                final = nxt[-1:]
            else:
                final = rows[b - a - 1 : b - a]
            observations[ted] = np.concatenate([rows[: b - a], final]) if last else rows[: b - a]
        dones = np.asarray(steps[self._keys["dones"]])
        if dones.size and not np.isin(dones, (0, 1)).all():
            self._notes.append(
                "data/<demo>/dones holds values other than 0 and 1 (robomimic writes 0 or 1): kept as "
                "info/dones; a demo ends terminated when its last one is not 0"
            )
        terminated = bool(dones[-1].any()) if last else False
        return Piece(
            label,
            observations,
            steps,
            terminated,
            source_id=demo.number,
            final_known=self._has_next,
            last=last,
        )


def _check_continuity(label: str, name: str, a: int, following: np.ndarray, nxt: np.ndarray) -> None:
    """``next_obs[t] == obs[t + 1]`` inside a demo (TED stores an observation once)."""
    if following.shape == nxt.shape and (
        np.array_equal(following, nxt, equal_nan=True) if following.dtype.kind in "fc" else
        np.array_equal(following, nxt)
    ):  # fmt: skip
        return
    rows = following.reshape(len(following), -1) != nxt.reshape(len(nxt), -1)
    if following.dtype.kind in "fc":
        rows &= ~(np.isnan(following).reshape(rows.shape) & np.isnan(nxt).reshape(rows.shape))
    t = a + int(np.flatnonzero(rows.any(axis=1))[0])
    raise SourceFormatError(
        f"{label}: next_obs/{name}[{t}] differs from obs/{name}[{t + 1}]; robomimic writes the next "
        "observation of a step as the following step's observation",
        hint="the file was not written by robomimic's dataset_states_to_obs.py: check it, or remove next_obs "
        "(the final observations then become unknown)",
    )


def _difference(mine: dict[str, Spec], first: dict[str, Spec], first_label: str) -> str:
    """How a demo's datasets differ from those of ``first_label`` (either may be the odd one)."""
    extra, missing = sorted(set(mine) - set(first)), sorted(set(first) - set(mine))
    if extra or missing:
        return (
            f"datasets differ from {first_label}'s"
            + (f"; unknown {extra}" if extra else "")
            + (f"; missing {missing}" if missing else "")
        )
    key = next(k for k in mine if mine[k] != first[k])
    return (
        f"{key!r} has shape {mine[key][0]} dtype {np.dtype(mine[key][1])} per step, but "
        f"{first[key][0]} {np.dtype(first[key][1])} in {first_label} "
        f"(mixed {'shapes' if mine[key][0] != first[key][0] else 'dtypes'} across demos)"
    )
