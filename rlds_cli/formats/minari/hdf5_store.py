"""Minari's ``hdf5`` storage: ``data/main_data.hdf5``, one ``episode_{id}`` group per episode, read
through h5py's low-level API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.hdf5_util import (
    check_dataset,
    open_hdf5,
    read_error,
)
from rlds_cli.formats.minari.layout import STEP_KEYS, Leaf, is_image_space, jpeg_frames
from rlds_cli.formats.untrusted import require_rows

_EPISODE_RE = re.compile(r"^episode_(\d+)$")
_INDEX_RE = re.compile(r"^_index_(\d+)$")


class Hdf5Store:
    """Minari's ``hdf5`` storage: ``main_data.hdf5``, one ``episode_{id}`` group per episode."""

    def __init__(self, h5_path: Path) -> None:
        self.where = self.h5_path = h5_path
        # links are checked here; each dataset's storage where it is read (_leaf_data)
        self._file = open_hdf5(h5_path, check_datasets=False)
        self._groups: dict[bytes, set[bytes]] = {}

    def close(self) -> None:
        self._file.close()

    def episode_ids(self) -> list[int]:
        import h5py

        f = self._file
        found = [
            int(m.group(1)) for m in map(_EPISODE_RE.match, f) if m and isinstance(f[m.group(0)], h5py.Group)
        ]
        if not found:
            raise SourceFormatError(f"{self.h5_path} has no episode_<id> groups (found: {sorted(f)[:5]})")
        return sorted(found)

    def count_mismatch(self, declared: int, found: list[int]) -> str:
        have = set(found)
        missing = [f"episode_{i}" for i in range(declared) if i not in have][:3]
        return (
            f"{self.h5_path}: metadata.json says total_episodes={declared} but the file has "
            f"{len(found)} episode groups" + (f" (missing {', '.join(missing)})" if missing else "")
        )

    def count_steps(self, ids: list[int]) -> int:
        return sum(int(self._file[f"episode_{i}"]["rewards"].shape[0]) for i in ids)

    def plan(self, first_id: int, spaces: dict[str, Any]) -> list[Leaf]:
        """The datasets of the first episode, as leaves to read from every episode."""
        first = self._file[f"episode_{first_id}"]
        for key in ("observations", *STEP_KEYS):
            if key not in first:
                raise SourceFormatError(f"{self.h5_path}: episode_{first_id} has no {key!r}")
        unknown = sorted(set(first) - {"observations", "infos", *STEP_KEYS})
        if unknown:
            raise SourceFormatError(
                f"{self.h5_path}:{first.name.lstrip('/')}: unknown datasets {unknown} (not in Minari's "
                "episode layout)"
            )
        import h5py

        leaves: list[Leaf] = []
        self._groups = {b".": {n.encode() for n in first}}
        self._plan_tree(
            first["observations"], "observations", "observation", spaces["observations"], "obs", leaves
        )
        self._plan_tree(first["actions"], "actions", "action", spaces["actions"], "action", leaves)
        for key in ("rewards", "terminations", "truncations"):
            leaves.append(Leaf(key.encode(), key, None, key))
        if isinstance(first.get("infos"), h5py.Group):
            self._plan_tree(first["infos"], "infos", "info", None, "info", leaves)
        return leaves

    def _plan_tree(
        self, node: Any, path: str, key: str, space: dict[str, Any] | None, role: str, leaves: list[Leaf]
    ) -> None:
        """Record the datasets below ``node`` (of the first episode) as leaves to read."""
        import h5py

        if isinstance(node, h5py.Dataset):
            leaves.append(Leaf(path.encode(), key, space, role))
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
                self._plan_tree(node[m.group(0)], f"{path}/{m.group(0)}", f"{key}/{j}", sub, role, leaves)
            return
        subs = (space or {}).get("subspaces") if kind == "Dict" else None
        for name in names:
            sub = subs.get(name) if isinstance(subs, dict) else None
            # raw names here; the reader cleans every leaf's key at once (formats/keys.py)
            self._plan_tree(node[name], f"{path}/{name}", f"{key}/{name}", sub, role, leaves)

    def _leaf_data(self, gid: Any, path: bytes, label: str) -> np.ndarray:
        """Read one dataset through h5py's low-level API (a fraction of the high-level cost per call, which
        matters over thousands of small episodes)."""
        import h5py
        from h5py import h5d, h5s

        try:
            d = h5d.open(gid, path)
        except KeyError:
            raise SourceFormatError(f"{label} is missing (missing group or dataset)") from None
        where = label[len(str(self.h5_path)) + 1 :]  # episode_N/observations/...
        shape, dtype = d.shape, d.dtype  # each is a call into HDF5: read once
        # untrusted input: no data from other files, no bombs, no 0-d "steps"
        check_dataset(self.h5_path, where, d, shape, dtype)
        require_rows(self.h5_path, where, shape)
        try:
            if dtype.kind in "OSUV" or h5py.check_vlen_dtype(dtype) is not None:
                return np.asarray(h5py.Dataset(d)[()])
            out = np.empty(shape, dtype)
            if out.size:
                d.read(h5s.ALL, h5s.ALL, out)
            return out
        except (OSError, RuntimeError) as exc:
            raise read_error(self.h5_path, label, exc) from exc

    def read(self, i: int, leaves: list[Leaf]) -> tuple[str, list[tuple[Leaf, Any]], Any]:
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
        out = []
        for leaf in leaves:
            data: Any = self._leaf_data(gid, leaf.path, f"{label}/{leaf.path.decode()}")
            space = leaf.space
            if (
                space is not None
                and is_image_space(space)
                and (data.dtype == object or tuple(data.shape[1:]) != tuple(space["shape"]))
            ):
                shape = tuple(space["shape"])
                data = jpeg_frames(list(data), shape, self.h5_path, f"{name}/{leaf.path.decode()}")
            out.append((leaf, data))
        return label, out, _hdf5_seed(gid)


def _hdf5_seed(gid: Any) -> Any:
    """The episode group's ``seed`` attribute as read (``None`` when absent)."""
    from h5py import h5a

    if not h5a.exists(gid, b"seed"):
        return None
    attr = h5a.open(gid, b"seed")
    if attr.dtype.kind not in "iufb":
        return f"<{attr.dtype} attribute>"
    value = np.zeros(attr.shape, attr.dtype)
    attr.read(value)
    return value
