"""Export to a tensordict memmap directory (what ``TensorDict.memmap`` writes and
``TensorDict.load_memmap`` reads), without needing tensordict installed.

Layout (tensordict 0.14): a directory per TensorDict level with a ``meta.json`` listing every
entry; each tensor is ``<key>.memmap``, its raw C-contiguous bytes in native order, with shape
and dtype only in ``meta.json``. Keys are written as TorchRL's TED: root ``observation``,
``action``, ``episode``, ``done``/``terminated``/``truncated`` (false, as after a reset),
``info/...``; ``next/`` holds ``observation``, ``reward``, ``done``, ``terminated``, ``truncated``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import atomic_target, iter_chunks

_TD_TYPE = "<class 'tensordict._td.TensorDict'>"
_TORCH_DTYPES = {
    "bool": "torch.bool",
    "uint8": "torch.uint8",
    "int8": "torch.int8",
    "int16": "torch.int16",
    "int32": "torch.int32",
    "int64": "torch.int64",
    "uint16": "torch.uint16",
    "uint32": "torch.uint32",
    "uint64": "torch.uint64",
    "float16": "torch.float16",
    "float32": "torch.float32",
    "float64": "torch.float64",
    "complex64": "torch.complex64",
    "complex128": "torch.complex128",
}
#: Characters tensordict encodes in file names (``_encode_key_for_filesystem``).
_UNSAFE = set('/<>:"|?*\\ %')


def encode_key(key: str) -> str:
    """A key part as tensordict names its file: unsafe characters as ``%XX``."""
    return "".join(f"%{ord(c):02X}" if c in _UNSAFE or ord(c) < 32 else c for c in key)


def _ted_columns(dataset: Dataset) -> dict[str, str]:
    """Output TED path -> the dataset key it is read from (``"=false"``: an all-false column)."""
    cols: dict[str, str] = {}
    for key, spec in dataset.stored_fields.items():
        cols[key] = key
        if spec.storage == "flat":
            cols[f"next/{key}"] = f"next/{key}"
    cols["episode"] = "episode"
    cols["next/done"] = "next/done"
    for flag in ("done", "terminated", "truncated"):
        cols[flag] = "=false"
    return cols


def export_torchrl(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as a tensordict memmap directory at ``out``."""
    n = dataset.num_steps
    fields = dataset.fields
    columns = _ted_columns(dataset)
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for path, source in columns.items():
        shape, dtype = ((1,), "bool") if source == "=false" else fields[source]
        if dtype not in _TORCH_DTYPES:
            raise ExportError(f"key {path!r} has dtype {dtype}, which torch tensors cannot hold")
        taken = next((p for p in path.split("/") if p in _META_NAMES), None)
        if taken is not None:  # meta.json's own fields at each level: tensordict loses such a key
            raise ExportError(
                f"{dataset.name}: key {path!r} holds the name {taken!r}, which a TensorDict memmap's "
                "meta.json uses for itself (the key would be lost)",
                hint="rename the key (rlds preprocess) before exporting",
            )
        specs[path] = (tuple(shape), dtype)
    with atomic_target(out, overwrite=overwrite, folder="meta.json") as tmp:
        _write_meta(tmp, specs, n)
        handles = {path: open(_file(tmp, path), "wb") for path in specs}  # noqa: SIM115
        try:
            reads = [s for s in columns.values() if not s.startswith("=")]
            for _, batch in iter_chunks(dataset, reads):
                rows = batch.batch_size
                for path, source in columns.items():
                    if source == "=false":
                        data = np.zeros((rows, 1), bool)
                    else:
                        data = np.ascontiguousarray(batch[source], dtype=np.dtype(specs[path][1]))
                    handles[path].write(data.data.cast("B"))
                if progress:
                    progress(rows)
        finally:
            for fh in handles.values():
                fh.close()
    return out


#: The fields of a level's ``meta.json`` besides its entries.
_META_NAMES = ("shape", "device", "_type")


def _file(base: Path, path: str) -> Path:
    *parents, leaf = path.split("/")
    return base.joinpath(*(encode_key(p) for p in parents), f"{encode_key(leaf)}.memmap")


def _write_meta(base: Path, specs: dict[str, tuple[tuple[int, ...], str]], n: int) -> None:
    """One ``meta.json`` per level: tensors as entries, sub-levels as ``{"type": "TensorDict"}``."""
    levels: dict[tuple[str, ...], dict[str, Any]] = {(): {}}
    for path, (shape, dtype) in specs.items():
        *parents, leaf = path.split("/")
        for depth in range(len(parents)):
            parent, child = tuple(parents[:depth]), parents[depth]
            levels.setdefault(parent, {})[encode_key(child)] = {"type": "TensorDict"}
            levels.setdefault(tuple(parents[: depth + 1]), {})
        levels.setdefault(tuple(parents), {})[encode_key(leaf)] = {
            "device": "cpu",
            "shape": [n, *shape],
            "dtype": _TORCH_DTYPES[dtype],
            "is_nested": False,
        }
    for parts, entries in levels.items():
        directory = base.joinpath(*(encode_key(p) for p in parts))
        directory.mkdir(parents=True, exist_ok=True)
        meta = {**entries, "shape": [n], "device": "cpu", "_type": _TD_TYPE}
        (directory / "meta.json").write_text(json.dumps(meta))
