"""Minari's ``arrow`` and ``parquet`` storages: ``data/<id>/part-0.<format>`` per episode, read with
pyarrow one episode at a time; the step columns' zero padding row dropped as minari's reader does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import MissingExtraError, SourceFormatError
from rlds_cli.formats.minari.layout import (
    EPISODE_DIR_RE,
    FIXED_LIST_SPACES,
    METADATA_FILE,
    STEP_KEYS,
    Leaf,
    is_image_space,
    jpeg_frames,
    space_leaves,
    space_shape,
)
from rlds_cli.formats.untrusted import read_json_file
from rlds_cli.frames.codecs import EncodedFrames

_ARROW_COLUMNS = ("observations", *STEP_KEYS, "infos")


class ArrowStore:
    """Minari's ``arrow`` and ``parquet`` storages, read with pyarrow one episode at a time (memory: one
    episode)."""

    def __init__(self, data_dir: Path, fmt: str, spaces: dict[str, Any], jpeg_encoding: bool) -> None:
        try:
            import pyarrow
            import pyarrow.dataset
        except ImportError:
            raise MissingExtraError(
                f"{data_dir}: Minari data_format {fmt!r} is read with pyarrow, which is not installed",
                hint="pip install 'rlds-cli[arrow]' (or pip install pyarrow)",
            ) from None
        self.pa = pyarrow
        self.pads = pyarrow.dataset
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
