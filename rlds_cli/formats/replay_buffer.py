"""diffusion_policy / UMI ``ReplayBuffer`` zarr stores (``--format replay_buffer``).

diffusion_policy (``diffusion_policy/common/replay_buffer.py``) and UMI keep demonstrations in a
zarr v2 group: ``data/<key>`` arrays of one length, every episode's steps end to end, and
``meta/episode_ends`` (int64, each episode's exclusive end). PushT's ``pusht_cchi_v7_replay`` is a
directory store; UMI's ``dataset.zarr.zip`` a ``ZipStore`` whose ``camera<i>_rgb`` arrays hold one
JPEG-XL image per chunk (numcodecs id ``imagecodecs_jpegxl``). Rules (``docs/formats.md``):

* **Episodes** are ``[episode_ends[i-1], episode_ends[i])``. ``episode_ends`` must be 1-d
  integers, non-decreasing, ending exactly where every ``data`` array ends (as upstream asserts);
  an empty episode is dropped with a note. Episode ids are the upstream indices.
* **Action**: ``data/action`` where there is one (diffusion_policy). Otherwise (UMI records none;
  its sampler builds one) UMI's: per robot ``robot<i>_eef_pos``, ``robot<i>_eef_rot_axis_angle``,
  ``robot<i>_gripper_width`` concatenated, the pose at step ``t`` (UMI makes it relative when
  sampling). ``--option action_key=KEY`` picks another data array (then not an observation), or
  ``umi``; anything else is refused with the keys listed.
* **Observations**: every other ``data/<key>`` is ``observation/<key>``; camera arrays (``uint8``
  ``(H, W, C)``) become frame columns under ``--frames``. An episode's final observation is not
  recorded: it repeats the last step's, ``final_known = false``.
* **Rewards and flags**: none recorded: ``next/reward`` is 0, every episode ends truncated.
* Other ``meta/`` arrays go to ``source_metadata.npz`` (``replay_buffer/meta/<key>``);
  ``meta/episode_<x>`` holds one row per source episode, cut to the episodes kept (one of
  another length is left out with a note).
* Missing chunks (read as the fill value, as upstream) are counted in a note; a chunk that does
  not decode stops the conversion naming the array and rows.
* ``--episodes A:B`` decodes only the chunks of those episodes' rows.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.rows import insert_rows
from rlds_cli.cache.layout import is_episode_array
from rlds_cli.cache.ted import column, is_numeric
from rlds_cli.errors import InvalidSelectionError, RldsError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import (
    ConversionReport,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    renamed_note,
    rows_per_block,
)
from rlds_cli.formats.untrusted import (
    check_chunks,
    check_declared,
    check_side_array,
    declared_bytes,
    require_shape,
)
from rlds_cli.formats.zarr_v2 import ZarrV2Store, is_zip, read_rows, require_codecs

#: Most rows per block (blocks are otherwise about 8 MiB of source rows).
BLOCK_ROWS = 1 << 16
#: ``action_key`` value that asks for UMI's action (its sampler's concatenation).
UMI_ACTION = "umi"
#: UMI's action parts per robot, in its sampler's order (``diffusion_policy/common/sampler.py``).
UMI_ACTION_PARTS = ("eef_pos", "eef_rot_axis_angle", "gripper_width")
#: The name of one of them: ``robot<i>_<part>``.
_UMI_PART = re.compile(rf"robot(\d+)_({'|'.join(UMI_ACTION_PARTS)})")
EPISODE_ENDS = "meta/episode_ends"


def _store_kind(path: Path) -> str | None:
    """``"dir"`` or ``"zip"`` where ``path`` holds a zarr v2 group with ``data`` and ``meta`` groups,
    else ``None``. Reads only directory entries or the zip's central directory."""
    try:
        if path.is_dir():
            if all((path / k).is_file() for k in (".zgroup", "data/.zgroup", "meta/.zgroup")):
                return "dir"
        elif path.name.lower().endswith(".zip") and is_zip(path):
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
            if {".zgroup", "data/.zgroup", "meta/.zgroup"} <= names:
                return "zip"
    except (OSError, zipfile.BadZipFile):  # (a damaged central directory: named by the reader)
        return None
    return None


def sniff(path: Path) -> bool:
    """Whether ``path`` is a ``ReplayBuffer`` zarr: a directory store or a ``.zip`` holding a zarr
    v2 group with ``data`` and ``meta`` groups."""
    return _store_kind(path) is not None


def nested_store(folder: Path) -> Path | None:
    """The one ``ReplayBuffer`` store below ``folder`` (a directory store at any depth, or a ``.zip`` of
    one), as in an unpacked ``pusht.zip``; ``None`` when there is none.

    Raises:
        SourceFormatError: Several stores below ``folder``.
    """
    candidates = {m.parent.parent for m in folder.rglob(".zgroup") if m.parent.name == "meta"}
    candidates |= set(folder.rglob("*.zip"))
    found = sorted(c for c in candidates if c != folder and sniff(c))
    if len(found) > 1:
        listed = ", ".join(str(f.relative_to(folder)) for f in found[:4])
        raise SourceFormatError(
            f"{folder} holds {len(found)} replay buffers ({listed}{', ...' if len(found) > 4 else ''})",
            hint="convert each store on its own: pass its path",
        )
    return found[0] if found else None


@dataclass(frozen=True)
class ReplayBufferOptions(ReaderOptions):
    """Options of :class:`ReplayBufferReader` (its keyword arguments)."""

    action_key: str | None = None
    block_rows: int | None = None


@dataclass
class _Array:
    """One ``data/<key>`` array: store name, TED key (``""`` for the action), declared shape and dtype,
    and its zarr array."""

    key: str
    ted: str
    shape: tuple[int, ...]
    dtype: np.dtype
    array: Any


class ReplayBufferReader(Reader):
    """Streams a diffusion_policy / UMI ``ReplayBuffer`` zarr (a directory or a ``.zarr.zip``).

    Args:
        path: The store: a ``*.zarr`` directory or a ``*.zarr.zip`` file.
        action_key: The data array that is the action, or ``"umi"`` for UMI's concatenation of
            each robot's pose and gripper width (default: ``action``, else UMI's where its keys
            are there).
        block_rows: Rows per block (default: about 8 MiB of source rows).
    """

    format_name = "replay_buffer"
    expected_files = "a diffusion_policy / UMI ReplayBuffer zarr (a .zarr directory or a .zarr.zip)"
    Options = ReplayBufferOptions
    sniff = staticmethod(sniff)

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        action_key: str | None = None,
        block_rows: int | None = None,
    ) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        if len(paths) != 1:
            raise SourceFormatError(
                f"{paths[0]}: a replay buffer is one zarr store; {len(paths)} paths were given",
                hint="convert each store on its own",
            )
        self.path = paths[0]
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        if _store_kind(self.path) is None and self.path.is_dir():
            self.path = nested_store(self.path) or self.path
        if _store_kind(self.path) is None:
            if self.path.is_file() and self.path.name.endswith(".zip") and not is_zip(self.path):
                ZarrV2Store(self.path)  # raises: the zip's own error (truncated, not a zip)
            raise SourceFormatError(
                f"{self.path} is not a ReplayBuffer zarr (a zarr v2 group with data/ and meta/ groups)",
                hint="pass the .zarr directory or .zarr.zip that diffusion_policy or UMI wrote",
            )
        self.report = ConversionReport(rules="replay-buffer-v1")
        self.store = ZarrV2Store(self.path)
        try:
            self._plan(action_key)
        except BaseException:
            self.store.close()
            raise
        self.report.source_rows = self.n
        #: The rows :meth:`blocks` reads (all, unless :meth:`select_episodes` narrows them).
        self.rows = (0, self.n)
        if block_rows:
            self.block_rows = block_rows
        else:
            row = sum(declared_bytes(a.shape[1:], a.dtype) for a in self.arrays.values())
            self.block_rows = rows_per_block(row, 1, BLOCK_ROWS)
            # whole chunks of the widest array per block: a chunk cut by a block is decoded twice
            widest = max(self.arrays.values(), key=lambda a: declared_bytes(a.shape[1:], a.dtype))
            chunk = int(widest.array.chunks[0]) or 1
            if chunk <= self.block_rows:
                self.block_rows -= self.block_rows % chunk

    # ------------------------------------------------------------------ planning

    def _plan(self, action_key: str | None) -> None:
        ends = self._episode_ends()
        self.arrays: dict[str, _Array] = {}
        for key in self.store.children("data"):
            meta = self.store.read_json(f"data/{key}/.zarray")
            if meta is None:
                self.report.notes.append(f"data/{key} is a group, not an array: not read")
                continue
            self._add_array(key, meta)
        if not self.arrays:
            raise SourceFormatError(f"{self.path}: the data group holds no arrays")
        self.n = int(ends[-1]) if len(ends) else 0
        for a in self.arrays.values():
            if a.shape[0] != self.n:
                raise SourceFormatError(
                    f"{self.path}: data/{a.key} has {a.shape[0]} rows but {EPISODE_ENDS} ends at step "
                    f"{self.n} (every data array has one row per step of the episodes)",
                    hint="the store is damaged or was cut while an episode was added (upstream's "
                    "ReplayBuffer refuses it too)",
                )
        if self.n == 0:
            raise SourceFormatError(
                f"{self.path}: the replay buffer holds no steps ({EPISODE_ENDS} is empty)"
            )
        starts = np.concatenate([[0], ends[:-1]])
        keep = ends > starts
        if not keep.all():
            self.report.dropped_episodes += int((~keep).sum())
            self.report.notes.append(
                f"{int((~keep).sum())} episode(s) of no steps (equal episode_ends) dropped: TED has no "
                "empty episodes"
            )
        self.episode_ids = np.flatnonzero(keep).astype(np.int64)
        self.last_steps = (ends[keep] - 1).astype(np.int64)
        self.report.expected = {"num_steps": self.n, "num_episodes": len(ends)}
        self._plan_action(action_key)
        self._check_chunks()
        self.report.synthesized_final_observations = len(self.last_steps)
        self.report.notes.append(
            "a replay buffer records no observation after an episode's last step: the final observation "
            "repeats the last step's (final_known = false)"
        )
        self.report.notes.append(
            "a replay buffer holds no rewards: next/reward = 0; every episode ends truncated"
        )

    def _episode_ends(self) -> np.ndarray:
        meta = self.store.read_json(f"{EPISODE_ENDS}/.zarray")
        if meta is None:
            raise SourceFormatError(
                f"{self.path} has no {EPISODE_ENDS} array; a ReplayBuffer stores where each episode "
                "ends there",
                hint="the store is damaged, or not a diffusion_policy / UMI replay buffer",
            )
        shape = require_shape(self.path, EPISODE_ENDS, meta.get("shape"))
        if len(shape) != 1:
            raise SourceFormatError(
                f"{self.path}: {EPISODE_ENDS} has shape {list(shape)}, not one end per episode"
            )
        array = self._open(EPISODE_ENDS, meta)
        if array.dtype.kind not in "iu":
            raise SourceFormatError(f"{self.path}: {EPISODE_ENDS} holds {array.dtype}, not integers")
        check_side_array(self.path, EPISODE_ENDS, shape, array.dtype)
        missing, expected = self.store.missing_chunks(EPISODE_ENDS, meta)
        if missing:  # the fill value would merge episodes: the ends are lost, not zero
            raise SourceFormatError(
                f"{self.path}: {missing} of the {expected} chunks of {EPISODE_ENDS} are not stored: "
                "where episodes end is lost",
                hint="the store is damaged: fetch or write it again",
            )
        stored = np.asarray(self._read(array, EPISODE_ENDS, 0, shape[0]))
        if stored.dtype == np.uint64 and len(stored) and int(stored.max()) > np.iinfo(np.int64).max:
            raise SourceFormatError(
                f"{self.path}: {EPISODE_ENDS} holds {int(stored.max())}, past any step count",
                hint="the store is damaged; episode ends are the cumulative step counts",
            )
        ends = stored.astype(np.int64)
        if len(ends) and ends[0] < 0:
            raise SourceFormatError(f"{self.path}: {EPISODE_ENDS} starts at {ends[0]}, below 0")
        back = np.flatnonzero(np.diff(ends) < 0)
        if len(back):
            i = int(back[0])
            raise SourceFormatError(
                f"{self.path}: {EPISODE_ENDS} goes back from {ends[i]} to {ends[i + 1]} at episode {i + 1} "
                "(episode ends never decrease)",
                hint="the store is damaged; episode ends are the cumulative step counts",
            )
        return ends

    def _open(self, key: str, meta: dict[str, Any]) -> Any:
        require_codecs(self.path, key, meta)
        return self.store.open_array(key)

    def _add_array(self, key: str, meta: dict[str, Any]) -> None:
        shape = require_shape(self.path, f"data/{key}", meta.get("shape"))
        if not shape:
            self.report.notes.append(f"data/{key} is a single value (0-d), not one row per step: not stored")
            return
        array = self._open(f"data/{key}", meta)
        if not is_numeric(array.dtype):
            self.report.notes.append(f"data/{key} holds {array.dtype}, not numbers: not stored")
            return
        # untrusted sizes: a few bytes of chunks must not declare gigabytes to allocate
        declared = declared_bytes(shape, array.dtype)
        check_declared(self.path, f"data/{key}", declared, self.store.stored_bytes(f"data/{key}"))
        check_chunks(self.path, f"data/{key}", tuple(array.chunks), array.dtype, declared)
        self.arrays[key] = _Array(key, "", shape, np.dtype(array.dtype), array)
        codec = next(iter([c.get("id") for c in _compressors(meta)]), None)
        if codec == "imagecodecs_jpegxl":
            self.report.notes.append(
                f"data/{key}: JPEG-XL chunks decoded with imagecodecs; the cache keeps the frames as "
                "--frames says (keep: raw arrays; webp: lossless, the decoded pixels exactly; jpeg: smaller)"
            )

    def _plan_action(self, action_key: str | None) -> None:
        if action_key is None:
            umi = any(_UMI_PART.fullmatch(k) for k in self.arrays)
            action_key = "action" if "action" in self.arrays else UMI_ACTION if umi else None
        if action_key is None:
            raise SourceFormatError(
                f"{self.path}: no data/action array and no UMI robot keys (robot0_eef_pos...): which array "
                f"is the action? (data arrays: {', '.join(self.arrays)})",
                hint="pass --option action_key=KEY (a data array), or action_key=umi",
            )
        if action_key == UMI_ACTION:
            umi_keys = self._umi_action_keys()
            if not umi_keys:
                raise SourceFormatError(
                    f"{self.path}: action_key=umi needs UMI's robot<i>_eef_pos, robot<i>_eef_rot_axis_angle "
                    f"and robot<i>_gripper_width arrays (data arrays: {', '.join(self.arrays)})",
                    hint="pass --option action_key=KEY naming a data array",
                )
            for k in umi_keys:
                if len(self.arrays[k].shape) != 2:
                    raise SourceFormatError(
                        f"{self.path}: data/{k} has shape {list(self.arrays[k].shape)}; UMI's action "
                        "concatenates (steps, d) arrays"
                    )
            self.action_keys = umi_keys
            self.report.notes.append(
                f"action = {' + '.join(umi_keys)} concatenated at each step (UMI's sampler; absolute poses, "
                "which UMI's dataset makes relative when it samples)"
            )
        elif action_key in self.arrays:
            self.action_keys = [action_key]
            if action_key != "action":
                self.report.notes.append(f"action = data/{action_key} (action_key)")
        else:
            raise SourceFormatError(
                f"{self.path}: action_key {action_key!r} is not a data array (data arrays: "
                f"{', '.join(self.arrays)})",
                hint="pass --option action_key=KEY naming one of them, or action_key=umi",
            )
        observed = [k for k in self.arrays if not (len(self.action_keys) == 1 and k == self.action_keys[0])]
        if not observed:
            raise SourceFormatError(
                f"{self.path}: the replay buffer holds no observation array beside its action "
                f"(data arrays: {', '.join(self.arrays)})",
                hint="a step needs an observation: a diffusion_policy / UMI buffer keeps them under data/",
            )
        wanted = {k: ("observation", k) for k in observed}
        cleaned = clean_keys(wanted)
        renamed = renamed_note(cleaned, wanted)
        if renamed:
            self.report.notes.append(renamed)
        for k in observed:
            self.arrays[k].ted = cleaned[k]
        self.observed = observed

    def _umi_action_keys(self) -> list[str]:
        """UMI's action arrays, in its sampler's order: per robot, pose, rotation, gripper width.

        Raises:
            SourceFormatError: A robot lacks one of them, or robots are numbered with a gap (the
                action would be built of the parts present, its columns shifted).
        """
        robots = sorted({int(m.group(1)) for k in self.arrays if (m := _UMI_PART.fullmatch(k))})
        wanted = [
            f"robot{robot}_{p}" for robot in range(max(robots, default=-1) + 1) for p in UMI_ACTION_PARTS
        ]
        missing = [k for k in wanted if k not in self.arrays]
        if missing:
            raise SourceFormatError(
                f"{self.path}: UMI's action needs data/{', data/'.join(missing)} (robots "
                f"{', '.join(map(str, robots))} have some of robot<i>_eef_pos, _eef_rot_axis_angle and "
                "_gripper_width); its columns would shift",
                hint="check that the buffer is whole, or pass --option action_key=KEY naming one data array",
            )
        return wanted

    def _check_chunks(self) -> None:
        for a in self.arrays.values():
            self._note_missing_chunks(f"data/{a.key}", self._meta(a.key), a.array)

    def _note_missing_chunks(self, key: str, meta: dict[str, Any], array: Any) -> None:
        """A note of the chunks of ``key`` the store lacks (read as the fill value, as upstream)."""
        missing, expected = self.store.missing_chunks(key, meta)
        if missing:
            self.report.notes.append(
                f"{key}: {missing} of {expected} chunks are not stored; zarr (and upstream's "
                f"ReplayBuffer) read them as the fill value {_plain(array.fill_value)!r}"
            )

    # ------------------------------------------------------------------ reading

    def _read(self, array: Any, key: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of ``array`` (``None``: all of it)."""
        try:
            return read_rows(array, start, stop)
        except RldsError:
            raise
        except Exception as exc:  # a codec's error on a damaged chunk: any class
            rows = f" rows {start}:{stop}" if start is not None else ""
            raise SourceFormatError(
                f"{self.path}: {key}{rows} cannot be read: a chunk does not decode "
                f"({type(exc).__name__}: {exc})",
                hint="the store is damaged: fetch or write it again",
            ) from None

    def total_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    def select_episodes(self, first: int, stop: int | None) -> int:
        """Read only the episodes at stream positions ``[first, stop)`` (empty episodes are not in the
        stream): one run of rows, so no other chunk is decoded."""
        kept = len(self.last_steps)
        if first >= kept:
            raise InvalidSelectionError(
                f"episodes {first}:{'' if stop is None else stop} selects none of the {kept} episodes of "
                f"{self.path} (numbered 0 to {kept - 1})",
                hint=f"ask for A:B with A < {kept}",
            )
        last = kept if stop is None else min(stop, kept)
        start = 0 if first == 0 else int(self.last_steps[first - 1]) + 1
        end = int(self.last_steps[last - 1]) + 1 if last > first else start
        self.rows = (start, end)
        return first

    def source_metadata(self) -> dict[str, Any]:
        arrays = {
            k: {
                "shape": list(a.shape),
                "dtype": a.dtype.str,
                "chunks": list(a.array.chunks),
                "compressor": next(iter([c.get("id") for c in _compressors(self._meta(k))]), None),
            }
            for k, a in self.arrays.items()
        }
        return {
            "replay_buffer": {
                "arrays": arrays,
                "action": self.action_keys,
                "episodes": int(self.report.expected["num_episodes"]),
                "steps": self.n,
                "store": "zip" if is_zip(self.path) else "directory",
            }
        }

    def _meta(self, key: str) -> dict[str, Any]:
        return self.store.read_json(f"data/{key}/.zarray") or {}

    def source_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for key in self.store.children("meta"):
            if key == "episode_ends":
                continue
            meta = self.store.read_json(f"meta/{key}/.zarray")
            if meta is None:
                continue
            shape = require_shape(self.path, f"meta/{key}", meta.get("shape"))
            array = self._open(f"meta/{key}", meta)
            if not is_numeric(array.dtype):
                self.report.notes.append(f"meta/{key} holds {array.dtype} values, not numbers: not kept")
                continue
            check_side_array(self.path, f"meta/{key}", shape, array.dtype)
            self._note_missing_chunks(f"meta/{key}", meta, array)
            name = f"replay_buffer/meta/{key}"
            if is_episode_array(name):  # one row per source episode: the rows of those streamed
                if not shape or shape[0] != self.report.expected["num_episodes"]:
                    self.report.notes.append(
                        f"meta/{key} has {shape[0] if shape else 0} rows for "
                        f"{self.report.expected['num_episodes']} episodes (an episode_ array has one "
                        "row per episode): not kept"
                    )
                    continue
                out[name] = self._read(array, f"meta/{key}")[self.episode_ids]
                continue
            out[name] = self._read(array, f"meta/{key}")
        return out

    def close(self) -> None:
        self.store.close()

    def _action(self, start: int, stop: int) -> np.ndarray:
        """The action rows ``[start, stop)``: the action array's, or UMI's parts side by side."""
        parts = [column(self._read(self.arrays[k].array, f"data/{k}", start, stop)) for k in self.action_keys]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the steps in order, ``block_rows`` at a time (an episode may span blocks)."""
        lo, hi = self.rows
        step = self.block_rows
        edges = [lo, *range((lo // step + 1) * step, hi, step), hi] if hi > lo else []
        for start, stop in pairwise(edges):  # on block (so chunk) boundaries
            rows = stop - start
            inside = (self.last_steps >= start) & (self.last_steps < stop)
            ends = self.last_steps[inside] - start
            action = self._action(start, stop)
            truncated = np.zeros((rows, 1), bool)
            truncated[ends] = True
            steps = {
                "action": action,
                "next/reward": np.zeros((rows, 1), np.float32),
                "next/terminated": np.zeros((rows, 1), bool),
                "next/truncated": truncated,
            }
            observations = {}
            for k in self.observed:
                a = self.arrays[k]
                values = self._read(a.array, f"data/{k}", start, stop)
                observations[a.ted] = insert_rows(values, ends, values[ends])
            yield StepBlock(
                steps=steps,
                observations=observations,
                ends=ends,
                final_known=np.zeros(len(ends), bool),
                episode_ids=self.episode_ids[inside],
            )
            if progress is not None:
                progress(rows)


def _plain(value: Any) -> Any:
    """A fill value as Python writes it (``0``, not ``np.uint8(0)``)."""
    return value.item() if isinstance(value, np.generic) else value


def _compressors(meta: dict[str, Any]) -> list[dict[str, Any]]:
    compressor = meta.get("compressor")
    return [compressor] if isinstance(compressor, dict) else []
