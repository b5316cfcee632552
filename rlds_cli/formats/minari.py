"""Minari datasets (HDF5 storage), streamed episode by episode into flat TED.

A Minari dataset directory holds ``data/metadata.json`` and ``data/main_data.hdf5`` with one
``episode_{id}`` group per episode: ``observations`` (and ``infos/*``) with ``T + 1`` rows, the
reset observation first; ``actions``, ``rewards``, ``terminations``, ``truncations`` with
``T`` rows. The rules below are written out in ``docs/formats.md``:

* Step ``t`` of an episode is ``(observations[t], actions[t]) -> observations[t + 1]`` with
  ``rewards[t]``, ``terminations[t]``, ``truncations[t]``: the final observation is real, so
  nothing is dropped or made up.
* Dict observation spaces become ``observation/<key>`` (nested dicts nest further), Tuple
  spaces ``observation/0``, ``observation/1``...; a plain Box is ``observation``. Discrete
  actions are stored as the integer index (``action`` of shape ``()``).
* ``infos/<k>`` with ``T + 1`` rows are observation-like: stored once as ``info/<k>`` and read
  back as ``info/<k>`` (at t) and ``next/info/<k>`` (at t + 1). ``infos/<k>`` with ``T`` rows
  are per-step values, stored as ``info/<k>`` only. No row is padded or invented (TorchRL pads a
  zero row in front of T-row infos).
* Image spaces that Minari >= 0.5.3 stored as JPEG bytes per frame are decoded to ``uint8``
  arrays (needs pillow: ``pip install 'rlds-cli[images]'``).
* An episode whose last step has neither flag (a collection stopped mid-episode) ends
  truncated, noted; a flag before the last step is an error.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.formats._episodes import Episode, EpisodePacker
from rlds_cli.formats.base import ConversionReport, ReaderBase, StepBlock
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.hdf5_util import open_hdf5, read_error, to_jsonable

METADATA_FILE = "metadata.json"
MAIN_FILE = "main_data.hdf5"
_EPISODE_RE = re.compile(r"^episode_(\d+)$")
_INDEX_RE = re.compile(r"^_index_(\d+)$")
_STEP_KEYS = ("actions", "rewards", "terminations", "truncations")
#: metadata.json entries that are JSON strings inside the JSON.
_JSON_STRING_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")


def data_dir_of(path: Path) -> Path:
    """The ``data/`` directory of a Minari dataset given its directory, ``data/`` or a file."""
    if path.is_file():
        return path.parent
    if (path / "data" / METADATA_FILE).is_file():
        return path / "data"
    return path


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a Minari conversion reads (hashed into the manifest)."""
    data = data_dir_of(paths[0])
    return [p for p in (data / METADATA_FILE, data / MAIN_FILE) if p.exists()]


def is_image_space(space: dict[str, Any] | None) -> bool:
    """Minari's test for an image space (JPEG-encoded since 0.5.3), on the JSON form."""
    if not space or space.get("type") != "Box":
        return False
    shape = space.get("shape", [])
    return (
        len(shape) in (2, 3)
        and shape[0] >= 32
        and shape[1] >= 32
        and space.get("dtype") == "uint8"
        and all(v == 0 for v in _flat(space.get("low")))
        and all(v == 255 for v in _flat(space.get("high")))
    )


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [value]


class MinariReader(ReaderBase):
    """Streams a Minari HDF5 dataset as :class:`StepBlock` s.

    Args:
        path: The dataset directory (holding ``data/``), its ``data/`` directory, or one of its
            files; a list of its files also works.
        block_rows: Ignored (blocks are sized in bytes); accepted for a uniform interface.
    """

    format_name = "minari"

    def __init__(self, path: str | Path | Sequence[str | Path], *, block_rows: int | None = None) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.data_dir = data_dir_of(paths[0])
        self.path = self.data_dir
        self.report = ConversionReport(rules="minari-v1")
        self._meta = self._read_metadata()
        fmt = self._meta.get("data_format", "hdf5")
        if fmt != "hdf5":
            raise SourceFormatError(
                f"{self.data_dir}: Minari data_format {fmt!r} is not supported; rlds reads Minari's hdf5 "
                "storage",
                hint="re-save the dataset as hdf5 with minari (pip install 'minari[arrow,hdf5]'; "
                "minari.create_dataset_from_buffers(..., data_format='hdf5'))",
            )
        self.h5_path = self.data_dir / MAIN_FILE
        self._file = open_hdf5(self.h5_path)
        try:
            self._inspect()
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        self._file.close()

    # ------------------------------------------------------------------ metadata and schema

    def _read_metadata(self) -> dict[str, Any]:
        meta_path = self.data_dir / METADATA_FILE
        if not meta_path.is_file():
            raise SourceFormatError(
                f"{self.data_dir} is not a Minari dataset: no {METADATA_FILE}",
                hint="pass the dataset directory (the one holding data/metadata.json)",
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SourceFormatError(f"{meta_path}: not valid JSON ({exc})") from exc
        if not isinstance(meta, dict):
            raise SourceFormatError(f"{meta_path}: expected a JSON object")
        self._spaces: dict[str, Any] = {}
        for key in _JSON_STRING_KEYS:
            value = meta.get(key)
            if isinstance(value, str):
                with contextlib.suppress(ValueError):  # not JSON: keep the raw string
                    meta[key] = json.loads(value)
        self._spaces = {"observations": meta.get("observation_space"), "actions": meta.get("action_space")}
        self.jpeg_encoding = bool(meta.get("jpeg_encoding", True))
        return meta

    def _inspect(self) -> None:
        import h5py

        f = self._file
        found: dict[int, str] = {}
        for name in f:
            m = _EPISODE_RE.match(name)
            if m and isinstance(f[name], h5py.Group):
                found[int(m.group(1))] = name
        if not found:
            raise SourceFormatError(f"{self.h5_path} has no episode_<id> groups (found: {sorted(f)[:5]})")
        self.episode_ids = sorted(found)
        declared = self._meta.get("total_episodes")
        if isinstance(declared, int) and declared != len(found):
            missing = [f"episode_{i}" for i in range(declared) if i not in found][:3]
            raise SourceFormatError(
                f"{self.h5_path}: metadata.json says total_episodes={declared} but the file has "
                f"{len(found)} episode groups" + (f" (missing {', '.join(missing)})" if missing else "")
            )
        self.report.expected = {
            k: int(self._meta[m])
            for k, m in (("num_episodes", "total_episodes"), ("num_steps", "total_steps"))
            if isinstance(self._meta.get(m), int)
        }
        first = f[found[self.episode_ids[0]]]
        for key in ("observations", *_STEP_KEYS):
            if key not in first:
                raise SourceFormatError(f"{self.h5_path}: episode_{self.episode_ids[0]} has no {key!r}")
        self._make_plan(first)
        if "num_steps" in self.report.expected:
            self._total = self.report.expected["num_steps"]  # progress only; checked after conversion
        else:
            self._total = sum(int(f[found[i]]["rewards"].shape[0]) for i in self.episode_ids)
        self.report.source_rows = self._total
        self._string_infos: set[str] = set()

    def total_rows(self) -> int:
        return self._total

    def source_metadata(self) -> dict[str, Any]:
        return {"minari": self._meta}

    def source_arrays(self) -> dict[str, np.ndarray]:
        seeds = getattr(self, "_seeds", None)
        if seeds is not None and (seeds >= 0).any():
            return {"minari/episode_seed": seeds}
        return {}

    # ------------------------------------------------------------------ reading

    def _leaf_data(self, gid: Any, path: bytes, label: str) -> np.ndarray:
        """Read one dataset through h5py's low-level API (a fraction of the high-level cost per
        call, which matters with thousands of small episodes)."""
        import h5py
        from h5py import h5d, h5s

        try:
            d = h5d.open(gid, path)
        except KeyError:
            raise SourceFormatError(f"{label} is missing (missing group or dataset)") from None
        try:
            if d.dtype.kind in "OSUV" or h5py.check_vlen_dtype(d.dtype) is not None:
                return np.asarray(h5py.Dataset(d)[()])
            out = np.empty(d.shape, d.dtype)
            if out.size:
                d.read(h5s.ALL, h5s.ALL, out)
            return out
        except (OSError, RuntimeError) as exc:
            raise read_error(self.h5_path, label, exc) from exc

    def _decode(self, data: np.ndarray, leaf: _Leaf, label: str) -> np.ndarray | None:
        space = leaf.space
        if (
            space is not None
            and is_image_space(space)
            and (data.dtype == object or tuple(data.shape[1:]) != tuple(space["shape"]))
        ):
            return _decode_jpeg(data, self.h5_path, label)
        if data.dtype.kind in "OSU":
            return None  # text: cannot live in a numeric cache
        return data

    def _plan_tree(self, node: Any, path: str, key: str, space: dict[str, Any] | None, role: str) -> None:
        """Record the datasets below ``node`` (of the first episode) as leaves to read."""
        import h5py

        if isinstance(node, h5py.Dataset):
            self._leaves.append(_Leaf(path.encode(), key, space, role))
            return
        names = list(node.keys())
        self._groups[path.encode()] = {n.encode() for n in names}
        indexed = [m for m in (_INDEX_RE.match(n) for n in names) if m]
        kind = (space or {}).get("type")
        if names and len(indexed) == len(names) and kind != "Dict":  # a Tuple space
            subs = (space or {}).get("subspaces") or []
            for m in sorted(indexed, key=lambda m: int(m.group(1))):
                j = int(m.group(1))
                sub = subs[j] if isinstance(subs, list) and j < len(subs) else None
                self._plan_tree(node[m.group(0)], f"{path}/{m.group(0)}", f"{key}/{j}", sub, role)
            return
        subs = (space or {}).get("subspaces") if kind == "Dict" else None
        for name in names:
            sub = subs.get(name) if isinstance(subs, dict) else None
            self._plan_tree(node[name], f"{path}/{name}", f"{key}/{_clean(name)}", sub, role)

    def _make_plan(self, first: Any) -> None:
        import h5py

        unknown = sorted(set(first) - {"observations", "infos", *_STEP_KEYS})
        if unknown:
            raise SourceFormatError(
                f"{self.h5_path}:{first.name.lstrip('/')}: unknown datasets {unknown} (not in Minari's "
                "episode layout)"
            )
        self._leaves: list[_Leaf] = []
        self._groups: dict[bytes, set[bytes]] = {b".": {n.encode() for n in first}}
        self._plan_tree(
            first["observations"], "observations", "observation", self._spaces["observations"], "obs"
        )
        if isinstance(first["actions"], h5py.Group):
            raise SourceFormatError(
                f"{self.h5_path}: Dict/Tuple action spaces are not supported (TED needs one 'action' array)"
            )
        self._leaves.append(_Leaf(b"actions", "action", self._spaces["actions"], "action"))
        for key in ("rewards", "terminations", "truncations"):
            self._leaves.append(_Leaf(key.encode(), key, None, key))
        if isinstance(first.get("infos"), h5py.Group):
            self._plan_tree(first["infos"], "infos", "info", None, "info")

    def _episode(self, i: int) -> Episode:
        from h5py import h5g

        name = f"episode_{i}"
        label = f"{self.h5_path}:{name}"
        gid = h5g.open(self._file.id, name.encode())
        for gpath, members in self._groups.items():
            try:
                got = set(gid if gpath == b"." else h5g.open(gid, gpath))
            except KeyError:
                raise SourceFormatError(f"{label} has no {gpath.decode()!r} group") from None
            if got != members:
                where = "" if gpath == b"." else f"{gpath.decode()}/"
                missing = sorted(f"{where}{n.decode()}" for n in members - got)
                unknown = sorted(f"{where}{n.decode()}" for n in got - members)
                if missing:
                    raise SourceFormatError(f"{label} has no {missing[0]!r} (missing group or dataset)")
                raise SourceFormatError(
                    f"{label}: unknown datasets {unknown} (not in Minari's episode layout)"
                )
        obs: dict[str, np.ndarray] = {}
        steps: dict[str, np.ndarray] = {}
        infos: dict[str, np.ndarray] = {}
        flags: dict[str, np.ndarray] = {}
        for leaf in self._leaves:
            where = f"{name}/{leaf.path.decode()}"
            data = self._decode(self._leaf_data(gid, leaf.path, f"{label}/{leaf.path.decode()}"), leaf, where)
            if data is None:
                if leaf.role == "action":
                    raise SourceFormatError(f"{label}: text actions are not supported")
                if leaf.key not in self._string_infos:
                    self._string_infos.add(leaf.key)
                    self.report.notes.append(f"{leaf.key}: text values are not stored (numeric arrays only)")
                continue
            {"obs": obs, "info": infos, "action": steps}.get(leaf.role, flags)[leaf.key] = data
        rewards, term, trunc = flags["rewards"], flags["terminations"], flags["truncations"]
        t = int(rewards.shape[0])
        for key, arr in (("actions", steps["action"]), ("terminations", term), ("truncations", trunc)):
            if arr.shape[0] != t:
                raise SourceFormatError(
                    f"{label}: {key!r} has {arr.shape[0]} rows, 'rewards' has {t} (ragged)"
                )
        for key, arr in obs.items():
            if arr.shape[0] != t + 1:
                raise SourceFormatError(
                    f"{label}: {key!r} has {arr.shape[0]} rows, expected {t + 1} (T+1 observations for "
                    f"{t} steps)"
                )
        steps["next/reward"] = _column(rewards)
        for key, arr in infos.items():
            if arr.ndim and arr.shape[0] == t + 1:
                obs[key] = arr
            elif arr.ndim and arr.shape[0] == t:
                steps[key] = arr
            else:
                raise SourceFormatError(
                    f"{label}: infos {key[5:]!r} has {arr.shape[0] if arr.ndim else 0} rows; expected "
                    f"{t + 1} (recorded at reset and every step) or {t}"
                )
        term_b = term.reshape(t) != 0
        trunc_b = trunc.reshape(t) != 0
        early = np.flatnonzero((term_b | trunc_b)[:-1])
        if len(early):
            raise SourceFormatError(
                f"{label}: step {int(early[0])} is flagged terminated/truncated before the episode's last "
                f"step {t - 1}"
            )
        terminated = bool(term_b[-1]) if t else False
        truncated = bool(trunc_b[-1]) if t else False
        if t and not (terminated or truncated):
            self._unflagged += 1
            truncated = True
        self._seeds[self._index[i]] = _seed(gid)
        return Episode(label, obs, steps, terminated, source_id=i, truncated=truncated)

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the dataset as blocks of whole episodes, in episode-id order."""
        packer = EpisodePacker(self.report)
        self._seeds = np.full(len(self.episode_ids), -1, np.int64)
        self._index = {i: j for j, i in enumerate(self.episode_ids)}
        self._unflagged = 0
        for i in self.episode_ids:
            ep = self._episode(i)
            yield from packer.add(ep)
            if progress is not None:
                progress(ep.length)
        yield from packer.finish()
        if self._unflagged:
            self.report.notes.append(
                f"{self._unflagged} episode(s) end with neither terminations nor truncations set; "
                "their last step is marked truncated"
            )


@dataclass(frozen=True)
class _Leaf:
    """A dataset read for every episode: its path in the episode group and its TED key."""

    path: bytes
    key: str
    space: dict[str, Any] | None
    role: str  # obs | action | rewards | terminations | truncations | info


def _seed(gid: Any) -> int:
    """The episode's ``seed`` attribute, or -1."""
    from h5py import h5a

    if not h5a.exists(gid, b"seed"):
        return -1
    attr = h5a.open(gid, b"seed")
    value = np.zeros(attr.shape, attr.dtype)
    attr.read(value)
    return int(value.reshape(-1)[0])


def _clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _decode_jpeg(data: np.ndarray, path: Path, label: str) -> np.ndarray:
    """JPEG bytes per frame (a 2-D uint8 array or a vlen array of them) -> uint8 images."""
    try:
        from PIL import Image
    except ImportError:
        raise SourceError(
            f"{path}: {label} holds JPEG-encoded frames and decoding them needs pillow",
            hint="pip install 'rlds-cli[images]' (or pip install pillow)",
        ) from None
    frames = []
    for j, raw in enumerate(data):
        try:
            with Image.open(io.BytesIO(np.asarray(raw, np.uint8).tobytes())) as img:
                frames.append(np.asarray(img, dtype=np.uint8))
        except Exception as exc:  # PIL raises many types for damaged data
            raise SourceFormatError(f"{path}: {label} frame {j} is not a readable JPEG ({exc})") from exc
    if any(fr.shape != frames[0].shape for fr in frames):
        raise SourceFormatError(f"{path}: {label} frames decode to different image shapes")
    return np.stack(frames) if frames else np.zeros((0,), np.uint8)


def episode_attrs_jsonable(group: Any) -> dict[str, Any]:
    """An episode group's attributes as JSON values (used by tests and ``inspect``)."""
    return {k: to_jsonable(v) for k, v in group.attrs.items()}
