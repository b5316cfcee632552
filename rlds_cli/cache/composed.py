"""Composed datasets, the read side: episodes of other cached datasets end to end, nothing copied.

Made by :mod:`rlds_cli.cache.compose` (``rlds merge``, ``rlds trim``, selections). The directory
holds ``manifest.json`` (``layout: "composed"``; ``source.parts`` names each parent, pins its
manifest digest, and gives the episodes taken and steps cut at each end) and ``episodes.npy``.
Each column is a :class:`~rlds_cli.cache.growing_columns.ConcatColumn` of the parents' rows
(whole, or through a :class:`~rlds_cli.cache.views.GatheredColumn`), so the flat layout holds.
A parent may be any non-growing dataset, opened as its own kind. An episode cut at its end
reads ``next/truncated`` true at its new last step; its final observation is the first cut
step's (a real one).

It opens only while every parent is the pinned version (else :class:`CorruptDatasetError` names
the parent), and ``rlds rm`` refuses to remove a parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset, Instructions, pinned_parent
from rlds_cli.cache.growing_columns import ConcatColumn
from rlds_cli.cache.layout import (
    COMPOSED_LAYOUT,
    FILTER_KEYS,
    MEMBER_ARRAY,
    SEGMENTED_LAYOUT,
    is_episode_array,
    text_blob_name,
)
from rlds_cli.cache.manifest import FieldSpec, Manifest, read_manifest
from rlds_cli.cache.views import GatheredColumn
from rlds_cli.errors import CorruptDatasetError

#: The flag an episode cut at its end reads true at its new last step.
TRUNCATED_KEY = "next/truncated"


@dataclass(frozen=True)
class Part:
    """One parent's share of a composed dataset: episodes ``episode_ids`` (ascending; ``None``:
    all), each with ``trim_start`` and ``trim_end`` steps cut."""

    parent: str
    parent_digest: str
    episode_ids: tuple[int, ...] | None = None
    trim_start: int = 0
    trim_end: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parent": self.parent, "parent_digest": self.parent_digest}
        if self.episode_ids is not None:
            out["episode_ids"] = list(self.episode_ids)
        if self.trim_start or self.trim_end:
            out["trim"] = [self.trim_start, self.trim_end]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Part:
        ids = data.get("episode_ids")
        trim = data.get("trim", [0, 0])
        return cls(
            str(data["parent"]),
            str(data["parent_digest"]),
            None if ids is None else tuple(int(i) for i in ids),
            int(trim[0]),
            int(trim[1]),
        )

    @property
    def whole(self) -> bool:
        """Whether the part is every episode and step of the parent (columns read as they are)."""
        return self.episode_ids is None and not self.trim_start and not self.trim_end

    def chosen(self, num_episodes: int) -> np.ndarray:
        """The parent's positions of this part's episodes."""
        if self.episode_ids is None:
            return np.arange(num_episodes, dtype=np.int64)
        return np.asarray(self.episode_ids, np.int64)

    def index(self, parent_index: np.ndarray) -> np.ndarray:
        """This part's episode index rows (``start`` in the parent's steps, after the cut)."""
        rows = np.asarray(parent_index[self.chosen(len(parent_index))]).copy()
        rows["start"] += self.trim_start
        rows["length"] -= self.trim_start + self.trim_end
        if self.trim_end:  # the final observation is the first cut step's: a real one
            rows["final_known"] = True
        return rows

    def rows(self, storage: str, parent_index: np.ndarray) -> np.ndarray:
        """The parent rows of a column with this storage kind (``flat`` includes each episode's
        final observation row)."""
        ids = self.chosen(len(parent_index))
        starts = parent_index["start"][ids].astype(np.int64) + self.trim_start
        lengths = parent_index["length"][ids].astype(np.int64) - self.trim_start - self.trim_end
        if storage == "flat":  # step t of episode e sits in flat row t + e
            starts, lengths = starts + ids, lengths + 1
        before = np.cumsum(lengths) - lengths
        return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def parts_of(manifest: Manifest) -> list[Part]:
    """The parts a composed dataset's manifest names, in order."""
    try:
        return [Part.from_dict(p) for p in manifest.source["parts"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptDatasetError(
            f"manifest of dataset {manifest.name!r} is malformed: bad 'source.parts' ({exc})"
        ) from exc


def open_directory(directory: Path, manifest: Manifest | None = None) -> Dataset:
    """The dataset in a published ``directory``, opened as its own kind.

    Raises:
        CorruptDatasetError: It is a growing dataset (a part pins one version).
    """
    manifest = manifest if manifest is not None else read_manifest(directory)
    if manifest.layout == COMPOSED_LAYOUT:
        return ComposedDataset(directory, manifest)
    if manifest.layout == SEGMENTED_LAYOUT:
        raise CorruptDatasetError(f"dataset {manifest.name!r} at {directory} is growing: it cannot be a part")
    return Dataset(directory, manifest)


class ComposedDataset(Dataset):
    """A read-only composed dataset: a :class:`Dataset` whose columns are its parents' rows.

    Raises:
        CorruptDatasetError: A parent is gone, or was replaced since the dataset was made.
    """

    #: What ``inspect --check`` calls the datasets :meth:`segment_datasets` returns.
    part_noun = "parent"

    def __init__(self, directory: Any, manifest: Manifest | None = None) -> None:
        super().__init__(directory, manifest)
        self.parts = parts_of(self.manifest)
        self._parents: list[Dataset] = [self._open_parent(part) for part in self.parts]
        self._rows: dict[tuple[int, str], np.ndarray] = {}
        self._cut_ends: np.ndarray | None = None
        self._arrays: dict[str, np.ndarray] | None = None  # source_arrays, made once

    def _open_parent(self, part: Part) -> Dataset:
        directory, manifest = pinned_parent(
            self.directory.parent,
            f"dataset {self.name!r}",
            part.parent,
            part.parent_digest,
            remove_hint=f"remove it ('rlds rm {self.name} --yes')",
            remake_hint="make it again (the same command with --force), or remove it "
            f"('rlds rm {self.name} --yes')",
        )
        return open_directory(directory, manifest)

    def segment_datasets(self) -> list[Dataset]:
        """The parent datasets, each once (what ``inspect --check`` verifies)."""
        seen: dict[str, Dataset] = {}
        for part, ds in zip(self.parts, self._parents, strict=True):
            seen.setdefault(part.parent, ds)
        return list(seen.values())

    @property
    def source_metadata(self) -> dict[str, Any]:
        """Its parents' source metadata when they all have the same (a trim; a merge of one
        source's views), else what they all say alike (:func:`agreed_metadata`): one source's
        facts (task texts, text tables, spaces) do not describe another's rows."""
        metas = [ds.source_metadata for ds in self.segment_datasets()]
        if not metas:
            return {}
        return metas[0] if _all_same(metas) else agreed_metadata(metas)

    @property
    def parents_agree(self) -> bool:
        """Whether every parent has the same source metadata (then it is this dataset's, and
        carries the parents' instructions as they are)."""
        return _all_same([ds.source_metadata for ds in self.segment_datasets()])

    @property
    def source_arrays(self) -> dict[str, np.ndarray]:
        """The parents' per-episode source arrays (``<format>/episode_<what>``) at this dataset's
        episodes, end to end, texts rebased into one blob (``<format>/text/<what>``); an array
        some parent lacks, or of other shapes, is left out (as are a parent's whole-dataset arrays)."""
        if self._arrays is None:
            self._arrays = self._episode_arrays()
        return self._arrays

    def _episode_arrays(self) -> dict[str, np.ndarray]:
        parts = [
            (parent.episode_source_arrays(), part.chosen(parent.num_episodes))
            for part, parent in zip(self.parts, self._parents, strict=True)
        ]
        common = set.intersection(*(set(arrays) for arrays, _ in parts)) if parts else set()
        out: dict[str, np.ndarray] = {}
        union = self.source_metadata.get(FILTER_KEYS)
        if isinstance(union, list) and union:  # columns by name, not by position
            common.discard(MEMBER_ARRAY)
            member = self._filter_key_members(union, parts)
            if member is not None:
                out[MEMBER_ARRAY] = member
        for key in sorted(k for k in common if is_episode_array(k)):
            blob = text_blob_name(key)
            values = [arrays[key] for arrays, _ in parts]
            if any(
                v.ndim == 0 or (len(ids) > 0 and int(ids.max()) >= len(v))
                for v, (_, ids) in zip(values, parts, strict=True)
            ):
                continue  # damaged, or not per episode: the check names it in the parent
            if blob in common and all(v.shape[1:] == (2,) for v in values):  # texts: byte ranges
                ranges, offset = [], 0
                for arrays, ids in parts:
                    rows = arrays[key][ids].astype(np.int64)
                    rows[rows[:, 0] >= 0] += offset  # -1: no text
                    ranges.append(rows)
                    offset += len(arrays[blob])
                out[key] = np.concatenate(ranges)
                out[blob] = np.concatenate([arrays[blob] for arrays, _ in parts])
            elif len({(v.shape[1:], v.dtype) for v in values}) == 1:
                out[key] = np.concatenate([v[ids] for v, (_, ids) in zip(values, parts, strict=True)])
        return out

    def _filter_key_members(
        self, union: list[str], parts: list[tuple[dict[str, np.ndarray], np.ndarray]]
    ) -> np.ndarray | None:
        """:data:`MEMBER_ARRAY` over ``union``, the parents' filter keys: each parent's episodes
        in the keys it names, in none of the others; ``None`` where a parent's array does not
        match its names (the check names it in the parent)."""
        columns = {name: j for j, name in enumerate(union)}
        pieces = []
        for parent, (arrays, ids) in zip(self._parents, parts, strict=True):
            names = parent.source_metadata.get(FILTER_KEYS)
            rows = np.zeros((len(ids), len(union)), bool)
            if isinstance(names, list) and names:
                own = arrays.get(MEMBER_ARRAY)
                if own is None or own.shape[1:] != (len(names),) or own.shape[0] <= ids.max(initial=-1):
                    return None
                for j, name in enumerate(names):
                    rows[:, columns[str(name)]] = own[ids, j]
            pieces.append(rows)
        return np.concatenate(pieces)

    @property
    def instructions(self) -> Instructions | None:
        """The parents' instructions (:attr:`Dataset.instructions`), their texts in one table, each
        text once: step columns of one key, each index read through its parent's map; or per
        episode (a parent without any: ``""``). ``None`` when no parent has any, or when they are
        held apart (a step column in one parent, per episode or none in another)."""
        found = [parent.instructions for parent in self._parents]
        if all(f is None for f in found):
            return None
        chosen = [
            part.chosen(parent.num_episodes) for part, parent in zip(self.parts, self._parents, strict=True)
        ]
        keys = {None if f is None else f.step_key for f in found}
        texts = list(
            dict.fromkeys(["" for f in found if f is None] + [t for f in found if f for t in f.texts])
        )
        number = {text: i for i, text in enumerate(texts)}
        if keys == {None}:  # per episode
            tasks = [
                np.zeros(len(ids), np.int64) + number[""]
                if f is None
                else np.array(
                    [number[f.texts[t]] for t in np.asarray(f.episode_task)[ids].tolist()], np.int64
                )
                for f, ids in zip(found, chosen, strict=True)
            ]
            return Instructions(texts, None, np.concatenate(tasks))
        (key,) = keys if len(keys) == 1 else (None,)
        if key is None:
            return None  # a step column in one parent, per episode (or none) in another
        maps: list[np.ndarray] = []
        tables: list[np.ndarray] = []
        for f, ids in zip(found, chosen, strict=True):
            assert f is not None
            own = np.array([number[t] for t in f.texts], np.int64)  # its texts -> ours
            if f.maps:  # a merge itself: its parents' tables, each through its map, then ours
                assert f.episode_table is not None
                tables.append(f.episode_table[ids] + len(maps))
                maps += [own[m] for m in f.maps]
            else:
                tables.append(np.full(len(ids), len(maps), np.int64))
                maps.append(own)
        if all((m == np.arange(len(m))).all() for m in maps):
            return Instructions(texts, key, None)  # every index already ours: read as stored
        return Instructions(texts, key, None, np.concatenate(tables), tuple(maps))

    def check_files(self) -> list[str]:
        """Every parent's files at full size (see :meth:`Dataset.check_files`); a file two parents
        read (two views of one dataset) is named once."""
        found: dict[str, str] = {}
        for ds in self.segment_datasets():
            for problem in ds.check_files():
                found.setdefault(problem, ds.name)
        self._check_not_replaced()
        return [f"parent {name!r}: {problem}" for problem, name in found.items()]

    def _part_rows(self, p: int, storage: str) -> np.ndarray:
        rows = self._rows.get((p, storage))
        if rows is None:
            rows = self._rows[(p, storage)] = self.parts[p].rows(storage, self._parents[p].episode_index)
        return rows

    def _open_column(self, key: str, spec: FieldSpec) -> Any:
        pieces: list[tuple[Any, int, int]] = []
        for p, (part, parent) in enumerate(zip(self.parts, self._parents, strict=True)):
            if key not in parent.manifest.fields:
                raise CorruptDatasetError(
                    f"dataset {self.name!r}: its parent {part.parent!r} stores no {key!r}"
                )
            if part.whole:
                rows = parent.num_steps + (parent.num_episodes if spec.storage == "flat" else 0)
                pieces.append((lambda parent=parent: parent.column(key), 0, rows))
            else:
                rows_of = self._part_rows(p, spec.storage)
                pieces.append(
                    (
                        lambda parent=parent, rows_of=rows_of: GatheredColumn(parent.column(key), rows_of),
                        0,
                        len(rows_of),
                    )
                )
        whole = len(pieces) == 1 and self.parts[0].whole  # the parent's own column serves
        column: Any = pieces[0][0]() if whole else ConcatColumn(pieces, spec.shape, spec.dtype)
        if key == TRUNCATED_KEY and any(part.trim_end for part in self.parts):
            column = CutEnds(column, self._cut_mask())
        return column

    def _cut_mask(self) -> np.ndarray:
        """True at the last step of each episode cut at its end."""
        if self._cut_ends is None:
            mask = np.zeros(self.num_steps, bool)
            lengths = self.episode_index["length"].astype(np.int64)
            last = self.episode_index["start"].astype(np.int64) + lengths - 1
            first_episode = 0
            for part, parent in zip(self.parts, self._parents, strict=True):
                count = len(part.chosen(parent.num_episodes))
                if part.trim_end:
                    mask[last[first_episode : first_episode + count]] = True
                first_episode += count
            self._cut_ends = mask
        return self._cut_ends


class CutEnds:
    """A boolean step column read with ``True`` forced at the rows of ``mask``, indexed like a
    numpy array along the first axis."""

    def __init__(self, column: Any, mask: np.ndarray) -> None:
        self._column = column
        self._mask = mask
        self.shape = tuple(column.shape)
        self.dtype = np.dtype(column.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        values = np.array(self._column[index], copy=True)
        cut = self._mask[index]
        if values.ndim > np.ndim(cut):  # a [N, 1] column
            cut = cut.reshape(*np.shape(cut), *([1] * (values.ndim - np.ndim(cut))))
        return values | cut

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[slice(None)]
        return data.astype(dtype) if dtype is not None else data


#: Sections of source metadata a merge keeps entry by entry where its parents differ (two
#: robomimic files of one task differ in their step count, not in their ``env_args``); any other
#: section is kept whole where they agree on all of it, else left out.
_BY_ENTRY = {("robomimic",), ("robomimic", "attrs"), ("lerobot",)}
#: Entries of those sections that count one source's rows: no merge of several holds that count.
_SOURCE_COUNTS = frozenset({"episodes", "total", "num_demos"})


def _all_same(metas: list[dict[str, Any]]) -> bool:
    return all(m == metas[0] for m in metas[1:])


def agreed_metadata(metas: list[dict[str, Any]], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """What every one of ``metas`` (the parents' source metadata) says alike: entries equal in
    all, entry by entry inside the sections of :data:`_BY_ENTRY` (less :data:`_SOURCE_COUNTS`),
    and the union of the parents' filter keys (a parent naming none holds none of its episodes)."""
    out: dict[str, Any] = {}
    for key, value in metas[0].items():
        if (not path and key == FILTER_KEYS) or (path and key in _SOURCE_COUNTS):
            continue
        if all(key in m and m[key] == value for m in metas[1:]):
            out[key] = value
        elif (*path, key) in _BY_ENTRY and all(isinstance(m.get(key), dict) for m in metas):
            out[key] = agreed_metadata([m[key] for m in metas], (*path, key))
    names = [m.get(FILTER_KEYS) for m in metas]
    if not path and any(names) and all(n is None or isinstance(n, list) for n in names):
        out[FILTER_KEYS] = sorted({str(k) for n in names if n for k in n})
    return out
