"""The metadata of a robomimic HDF5 file (robomimic, LIBERO, RoboCasa, MimicGen): the ``data``
group's attributes, each demo's attributes, and the filter keys (``mask/<key>``), read once
while the reader plans the conversion.

What is kept, and where (the rules are written out in ``docs/formats.md``):

* ``data`` attributes: every one in the manifest (``source.metadata.robomimic.attrs``, as
  written; arrays as lists). ``env_args`` (robomimic, LIBERO) and ``problem_info`` (LIBERO) are
  JSON strings and are also kept parsed (``env_args``, ``problem_info``); LIBERO's
  ``problem_info.language_instruction`` is ``language_instruction``.
* Per-demo attributes, one row per episode in ``source_metadata.npz``
  (:meth:`rlds_cli.cache.dataset.Dataset.episode_metadata` reads them back): text
  (``model_file``, RoboCasa's ``ep_meta``, ``camera_info``) as ``robomimic/episode_<attr>``
  ``[start, stop)`` byte ranges into ``robomimic/text/<attr>`` (UTF-8, each distinct text once;
  ``-1`` where a demo has none); numbers (``num_samples``, LIBERO's ``init_state``) as
  ``robomimic/episode_<attr>``. RoboCasa's ``ep_meta["lang"]`` is also ``robomimic/episode_lang``.
* Filter keys: their names in ``source.metadata.filter_keys`` and, per episode, which keys hold
  it (``filter_keys/episode_member``, bool, one column per name): row ``i`` describes the
  dataset's episode ``i``, so the keys stay right after ``--episodes A:B``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.selected import MEMBER_ARRAY as MEMBER_ARRAY
from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.hdf5_util import to_jsonable
from rlds_cli.formats.untrusted import check_side_array

#: The JSON attributes of ``data`` that are kept parsed too.
JSON_ATTRS = ("env_args", "problem_info")


def _text(value: Any) -> str | None:
    """An attribute as text (h5py gives ``str`` for variable-length strings, ``bytes`` for
    fixed-width ones), or ``None`` when it is not text."""
    if isinstance(value, str):
        return value
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
    except ValueError:
        return None


@dataclass
class DemoTexts:
    """Per-episode text attributes, each distinct text stored once in a byte blob."""

    blobs: dict[str, bytearray] = field(default_factory=dict)
    seen: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def add(self, episode: int, attr: str, text: str | None) -> None:
        """Record ``text`` (``None``: the demo has none) for episode ``episode``."""
        rows = self.ranges.setdefault(attr, [])
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
        return {"robomimic": meta, "filter_keys": sorted(self.masks)}


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
    masks: dict[str, list[str]] = {}
    known = set(demos)
    group = f.get("mask")
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
                if attr == "ep_meta":  # RoboCasa: the task's language instruction
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
