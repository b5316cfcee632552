"""The Minari reader and Minari's storages (``hdf5``, ``arrow``, ``parquet``), read one episode at a
time.

:class:`MinariReader`: a Minari dataset (any storage) streamed episode by episode into flat TED
(the rules: :mod:`rlds_cli.formats.minari`).

Minari's storages, read one episode at a time: ``hdf5`` (:class:`Hdf5Store`), ``arrow`` and
``parquet`` (:class:`ArrowStore`).

Minari's ``hdf5`` storage: ``data/main_data.hdf5``, one ``episode_{id}`` group per episode, read
through h5py's low-level API.

Minari's ``arrow`` and ``parquet`` storages: ``data/<id>/part-0.<format>`` per episode, read with
pyarrow one episode at a time; the step columns' zero padding row dropped as minari's reader does.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError, import_extra
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Episode,
    EpisodeSchema,
    Reader,
    StepBlock,
    clean_keys,
    from_layout,
    is_text,
    renamed_note,
    text_note,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.hdf5_util import (
    check_dataset,
    open_hdf5,
    read_error,
    to_jsonable,
)
from rlds_cli.formats.minari import layout
from rlds_cli.formats.minari.layout import (
    ARROW_FORMATS,
    EPISODE_DIR_RE,
    FIXED_LIST_SPACES,
    MAIN_FILE,
    METADATA_FILE,
    SPACE_KEYS,
    STEP_KEYS,
    Leaf,
    Store,
    as_seed,
    data_dir_of,
    is_image_space,
    jpeg_frames,
    read_metadata,
    space_leaves,
    space_shape,
)
from rlds_cli.formats.untrusted import read_json_file, require_rows
from rlds_cli.frames.codecs import EncodedFrames

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
            # raw names here; the reader cleans every leaf's key at once (formats/base.py)
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


_ARROW_COLUMNS = ("observations", *STEP_KEYS, "infos")


class ArrowStore:
    """Minari's ``arrow`` and ``parquet`` storages, read with pyarrow one episode at a time (memory: one
    episode)."""

    def __init__(self, data_dir: Path, fmt: str, spaces: dict[str, Any], jpeg_encoding: bool) -> None:
        self.pa = import_extra(
            "pyarrow",
            f"{data_dir}: Minari data_format {fmt!r}",
            hint="pip install 'rlds-cli[arrow]' (or pip install pyarrow)",
        )
        self.pads = importlib.import_module("pyarrow.dataset")
        self.where = data_dir
        self.fmt = fmt
        self.jpeg_encoding = jpeg_encoding
        for role in ("observations", "actions"):
            space = spaces.get(role)
            if not isinstance(space, dict) or "type" not in space:
                raise SourceFormatError(
                    f"{data_dir / METADATA_FILE}: no readable {role[:-1]}_space; rlds needs it to read "
                    f"Minari's {fmt} storage",
                    hint="minari writes both spaces into metadata.json; re-create the dataset with minari",
                )
        self._dirs = {
            int(d.name): d for d in data_dir.iterdir() if d.is_dir() and EPISODE_DIR_RE.match(d.name)
        }
        self._info_paths: list[bytes] = []

    def close(self) -> None:
        """Nothing stays open between episodes."""

    def episode_ids(self) -> list[int]:
        if not self._dirs:
            raise SourceFormatError(
                f"{self.where} has no episode directories (data/<id>/part-0.{self.fmt})",
                hint="pass the dataset directory that minari wrote (data/metadata.json and data/0/, ...)",
            )
        return sorted(self._dirs)

    def count_mismatch(self, declared: int, found: list[int]) -> str:
        have = set(found)
        missing = [f"{i}/" for i in range(declared) if i not in have][:3]
        return (
            f"{self.where}: metadata.json says total_episodes={declared} but there are {len(found)} episode "
            "directories" + (f" (missing {', '.join(missing)})" if missing else "")
        )

    def _files(self, i: int) -> list[Path]:
        d = self._dirs[i]
        # what minari's reader reads: every file but metadata.json and hidden/underscore ones
        files = sorted(
            f
            for f in d.iterdir()
            if f.is_file() and f.name != METADATA_FILE and not f.name.startswith(("_", "."))
        )
        if not files:
            raise SourceFormatError(f"{d}: no {self.fmt} file (expected part-0.{self.fmt})")
        return files

    def count_steps(self, ids: list[int]) -> int:
        total = 0
        for i in ids:  # row counts come from the file footers; every episode has one padding row
            total += max(0, int(self._dataset(i).count_rows()) - 1)
        return total

    def _dataset(self, i: int) -> Any:
        try:
            return self.pads.dataset([str(f) for f in self._files(i)], format=self.fmt)
        except (self.pa.ArrowException, OSError, ValueError) as exc:
            raise SourceFormatError(
                f"{self._dirs[i]}: not a readable {self.fmt} episode (truncated or corrupt?): "
                f"{_first_line(exc)}"
            ) from exc

    def _table(self, i: int) -> Any:
        dataset = self._dataset(i)
        try:
            return dataset.to_table()
        except (self.pa.ArrowException, OSError, ValueError) as exc:
            raise SourceFormatError(
                f"{self._dirs[i]}: not a readable {self.fmt} episode (truncated or corrupt?): "
                f"{_first_line(exc)}"
            ) from exc

    def plan(self, first_id: int, spaces: dict[str, Any]) -> list[Leaf]:
        table = self._table(first_id)
        self._check_columns(table, str(self._dirs[first_id]))
        leaves: list[Leaf] = []
        space_leaves(spaces["observations"], "observations", "observation", (), "obs", leaves)
        space_leaves(spaces["actions"], "actions", "action", (), "action", leaves)
        for key in ("rewards", "terminations", "truncations"):
            leaves.append(Leaf(key.encode(), key, None, key))
        if "infos" in table.column_names:
            self._info_leaves(table.schema.field("infos").type, "infos", "info", (), leaves)
        self._info_paths = [leaf.path for leaf in leaves if leaf.role == "info"]
        return leaves

    def _info_leaves(
        self, type_: Any, path: str, key: str, fields: tuple[str, ...], leaves: list[Leaf]
    ) -> None:
        for field in type_:
            if self.pa.types.is_struct(field.type):
                self._info_leaves(
                    field.type, f"{path}/{field.name}", f"{key}/{field.name}", (*fields, field.name), leaves
                )
            else:
                leaves.append(
                    Leaf(
                        f"{path}/{field.name}".encode(),
                        f"{key}/{field.name}",
                        None,
                        "info",
                        (*fields, field.name),
                    )
                )

    def _check_columns(self, table: Any, label: str) -> None:
        names = table.column_names
        missing = [c for c in ("observations", *STEP_KEYS) if c not in names]
        if missing:
            raise SourceFormatError(f"{label} has no {missing[0]!r} column (missing column)")
        unknown = sorted(set(names) - set(_ARROW_COLUMNS))
        if unknown:
            raise SourceFormatError(f"{label}: unknown columns {unknown} (not in Minari's episode layout)")

    def read(self, i: int, leaves: list[Leaf]) -> tuple[str, list[tuple[Leaf, Any]], Any]:
        label = str(self._dirs[i])
        table = self._table(i)
        self._check_columns(table, label)
        n = table.num_rows
        if n == 0:
            raise SourceFormatError(f"{label}: no rows (an episode holds at least its reset observation)")
        probe: list[Leaf] = []
        if "infos" in table.column_names:
            self._info_leaves(table.schema.field("infos").type, "infos", "info", (), probe)
        paths = [leaf.path for leaf in probe]
        if paths != self._info_paths:
            extra = sorted(p.decode() for p in set(paths) - set(self._info_paths))
            missing = sorted(p.decode() for p in set(self._info_paths) - set(paths))
            raise SourceFormatError(
                f"{label}: infos differ from the first episode"
                + (f"; unknown {extra}" if extra else "")
                + (f"; missing {missing}" if missing else "")
            )
        columns: dict[str, Any] = {}
        out = []
        for leaf in leaves:
            path = leaf.path.decode()
            top = path.split("/", 1)[0]
            if top not in columns:
                columns[top] = table.column(top).combine_chunks()
            values, field = columns[top], None
            for name in leaf.fields:
                field = values.type.field(name) if self.pa.types.is_struct(values.type) else None
                if field is None:
                    raise SourceFormatError(f"{label}: {path!r} is not a struct field of {top!r}")
                values = values.field(name)
            if leaf.role in ("action", "rewards", "terminations", "truncations"):
                # minari pads these columns with one zero row so that every column has T + 1 rows
                values = values.slice(0, n - 1)
            out.append((leaf, self._decode(values, leaf, field, f"{label}/{path}")))
        return label, out, self._episode_seed(i)

    def _decode(self, values: Any, leaf: Leaf, field: Any, where: str) -> np.ndarray | EncodedFrames:
        """One column as minari's arrow reader decodes it (``_decode_space`` / ``_decode_info``)."""
        pa = self.pa
        space = leaf.space
        kind = (space or {}).get("type")
        if values.null_count and not (kind == "Text" or pa.types.is_string(values.type)):
            raise SourceFormatError(f"{where}: {values.null_count} null value(s) (Minari writes none here)")
        if leaf.role == "info":
            return self._info(values, field, where)
        if leaf.role in ("rewards", "terminations", "truncations"):
            return values.to_numpy(zero_copy_only=False)
        if self.jpeg_encoding and is_image_space(space) and pa.types.is_binary(values.type):
            assert space is not None  # an image space
            return jpeg_frames(values.to_pylist(), tuple(space["shape"]), self.where, where)
        if kind in FIXED_LIST_SPACES:
            assert space is not None
            return self._fixed_list(values, space_shape(space), where)
        if kind == "Discrete":
            return values.to_numpy(zero_copy_only=False)
        if kind == "Text":
            return np.asarray(values.to_pylist(), dtype=object)
        raise SourceFormatError(
            f"{where}: {kind} spaces are not supported (rlds reads Box, Discrete, MultiDiscrete, "
            "MultiBinary, Text, Dict and Tuple spaces)"
        )

    def _fixed_list(self, values: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
        if not self.pa.types.is_fixed_size_list(values.type):
            raise SourceFormatError(f"{where}: expected fixed-size lists, found {values.type}")
        # flatten() honours the array's offset (a slice), unlike .values
        flat = values.flatten().to_numpy(zero_copy_only=False)
        if flat.size != len(values) * int(np.prod(shape, dtype=np.int64)):
            raise SourceFormatError(f"{where}: {values.type} does not hold values of shape {shape}")
        return flat.reshape(len(values), *shape)

    def _info(self, values: Any, field: Any, where: str) -> np.ndarray:
        pa = self.pa
        if pa.types.is_fixed_size_list(values.type):
            data = values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), -1)
        elif pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            try:  # minari stacks the rows: they must have one length
                data = np.stack(values.to_numpy(zero_copy_only=False))
            except ValueError:
                raise SourceFormatError(f"{where}: rows are lists of different lengths") from None
        elif pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
            return np.asarray(values.to_pylist(), dtype=object)
        else:
            return values.to_numpy(zero_copy_only=False)
        meta = field.metadata if field is not None else None
        if meta and b"shape" in meta:
            # minari's per-row shape; '' (a 0-d array per row) is a scalar (minari fails to read it)
            shape = tuple(int(d) for d in meta[b"shape"].split(b",") if d.strip())
            try:
                data = data.reshape(len(values), *shape)
            except ValueError:
                raise SourceFormatError(
                    f"{where}: rows do not have the shape {shape} the file declares"
                ) from None
        return data

    def _episode_seed(self, i: int) -> Any:
        path = self._dirs[i] / METADATA_FILE
        if not path.is_file():
            return None
        meta = read_json_file(path, "an episode's metadata")
        if not isinstance(meta, dict):
            raise SourceFormatError(f"{path}: expected a JSON object")
        return meta.get("seed")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@from_layout(layout)  # sniff, source_files and EXPECTED_FILES: formats/minari/layout.py
class MinariReader(Reader):
    """Streams a Minari dataset (HDF5, Arrow or Parquet storage) as :class:`StepBlock` s.

    Args:
        path: The dataset directory (holding ``data/``), its ``data/`` directory, one of its files,
            a namespace directory holding one dataset, or a list of its files.
    """

    format_name = "minari"

    def __init__(self, path: str | Path | Sequence[str | Path]) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.data_dir = data_dir_of(paths[0])
        self.path = self.data_dir
        self.report = ConversionReport(rules="minari-v2")
        self._meta = read_metadata(self.data_dir)
        self._spaces: dict[str, Any] = {
            "observations": self._meta.get("observation_space"),
            "actions": self._meta.get("action_space"),
        }
        self.jpeg_encoding = bool(self._meta.get("jpeg_encoding", True))
        fmt = self._meta.get("data_format", "hdf5")
        self.data_format = fmt
        self._store: Store
        if fmt == "hdf5":
            self._store = Hdf5Store(self.data_dir / MAIN_FILE)
        elif fmt in ARROW_FORMATS:
            self._store = ArrowStore(self.data_dir, fmt, self._spaces, self.jpeg_encoding)
        else:
            raise SourceFormatError(
                f"{self.data_dir / METADATA_FILE}: unknown Minari data_format {fmt!r}",
                hint="Minari writes 'hdf5', 'arrow' or 'parquet'; re-create the dataset with minari",
            )
        try:
            self._inspect()
        except BaseException:
            self._store.close()
            raise

    def close(self) -> None:
        self._store.close()

    # ------------------------------------------------------------------ metadata and schema
    def _inspect(self) -> None:
        store = self._store
        ids = store.episode_ids()
        self.episode_ids = ids
        declared = self._meta.get("total_episodes")
        if isinstance(declared, int) and declared != len(ids):
            raise SourceFormatError(store.count_mismatch(declared, ids))
        self.report.expected = {
            k: int(self._meta[m])
            for k, m in (("num_episodes", "total_episodes"), ("num_steps", "total_steps"))
            if isinstance(self._meta.get(m), int)
        }
        leaves = store.plan(ids[0], self._spaces)
        # one cleaner for every reader: 'pos x' and 'pos_x' never share a key
        wanted = {leaf.path.decode(): tuple(leaf.key.split("/")) for leaf in leaves}
        cleaned = clean_keys(wanted)
        self._leaves = [dataclasses.replace(leaf, key=cleaned[leaf.path.decode()]) for leaf in leaves]
        renamed = renamed_note(cleaned, wanted)
        if renamed:
            self.report.notes.append(renamed)
        if "num_steps" in self.report.expected:
            self._total = self.report.expected["num_steps"]  # progress only; checked after conversion
        else:
            self._total = store.count_steps(ids)
        self.report.source_rows = self._total
        self._text_keys: set[str] = set()

    def total_rows(self) -> int:
        return self._total

    def source_metadata(self) -> dict[str, Any]:
        """``minari``: metadata.json (inner JSON strings decoded) less the spaces and env specs, which go
        under ``spaces`` with the source path of every TED key."""
        spaces: dict[str, Any] = {
            # each space is the JSON object minari.serialization.serialize_space writes
            "serializer": "minari",
            "observation_space": self._meta.get("observation_space"),
            "action_space": self._meta.get("action_space"),
            "env_spec": self._meta.get("env_spec"),
            "jpeg_encoding": self.jpeg_encoding,
            "paths": {
                leaf.key: leaf.path.decode()
                for leaf in self._leaves
                if leaf.role in ("obs", "action", "info") and leaf.key not in self._text_keys
            },
        }
        if "eval_env_spec" in self._meta:
            spaces["eval_env_spec"] = self._meta["eval_env_spec"]
        return {"minari": {k: v for k, v in self._meta.items() if k not in SPACE_KEYS}, "spaces": spaces}

    def source_arrays(self) -> dict[str, np.ndarray]:
        present = getattr(self, "_seed_present", None)
        if present is not None and present.any():
            return {"minari/episode_seed": self._seeds, "minari/episode_seed_present": present}
        return {}

    # ------------------------------------------------------------------ reading

    def _episode(self, i: int) -> Episode:
        label, columns, seed = self._store.read(i, self._leaves)
        obs: dict[str, np.ndarray] = {}
        steps: dict[str, np.ndarray] = {}
        infos: dict[str, np.ndarray] = {}
        flags: dict[str, np.ndarray] = {}
        actions: list[tuple[Leaf, np.ndarray]] = []
        for leaf, data in columns:
            if is_text(data.dtype):  # strings: never stored as object pointers
                if leaf.role not in ("obs", "info"):  # actions, rewards and flags must be numbers
                    raise SourceFormatError(
                        f"{label}: {leaf.path.decode()!r} holds text, which is not supported there "
                        "(actions, rewards and flags must be numbers)",
                        hint="rlds stores numeric arrays only; fix the named dataset of the file",
                    )
                if leaf.key not in self._text_keys:
                    self._text_keys.add(leaf.key)
                    self.report.notes.append(text_note(leaf.key, data.dtype))
                continue
            if leaf.role == "action":
                actions.append((leaf, data))
                steps[leaf.key] = data
            else:
                {"obs": obs, "info": infos}.get(leaf.role, flags)[leaf.key] = data
        rewards, term, trunc = flags["rewards"], flags["terminations"], flags["truncations"]
        t = int(rewards.shape[0])
        checked = [(leaf.path.decode(), arr) for leaf, arr in actions]
        for key, arr in (*checked, ("terminations", term), ("truncations", trunc)):
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
        self._record_seed(self._index[i], seed, label)
        return Episode(label, obs, steps, terminated, source_id=i, truncated=truncated)

    def _record_seed(self, j: int, raw: Any, label: str) -> None:
        if raw is None:
            return
        value = as_seed(raw)
        if value is None:
            self._bad_seeds.append(f"{label}: {to_jsonable(raw)!r}")
            return
        self._seeds[j] = value
        self._seed_present[j] = True

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the dataset as blocks of whole episodes, in episode-id order."""
        packer = BlockPacker(admit=EpisodeSchema(self.report))
        # uint64 holds every seed minari can write; absent ones are 0 with present False
        self._seeds = np.zeros(len(self.episode_ids), np.uint64)
        self._seed_present = np.zeros(len(self.episode_ids), bool)
        self._bad_seeds: list[str] = []
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
        if self._bad_seeds:
            self.report.notes.append(
                f"{len(self._bad_seeds)} episode seed(s) are not integers in [0, 2**64 - 1] and are kept "
                f"as absent (minari/episode_seed_present false); first: {self._bad_seeds[0]}"
            )
