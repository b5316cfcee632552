"""Export to the D4RL layout, as HDF5 (what d4rl's ``get_dataset`` reads) or as one ``.npz``.

Columns: ``observations``, ``actions``, ``rewards`` (N,), ``terminals`` (N,), ``timeouts`` (N,:
``next/truncated``), ``next_observations`` (so every final observation survives) and
``infos/<k>`` for each ``info/<k>`` key, and a D4RL source's ``metadata/`` (its datasets and
attributes, and the file's attributes) as the source had them. Converting the file back with
``rlds download FILE --format d4rl`` gives the same transitions and episodes (``final_known``
flags excepted: the file has no place for them).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import (
    CHUNK_STEPS,
    HDF5_SIGNATURE,
    NPZ_SIGNATURES,
    atomic_target,
    flat_keys,
    raw_bytes,
    step_keys,
)


def _columns(dataset: Dataset) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """D4RL name -> (TED key, per-row shape, dtype)."""
    flats = flat_keys(dataset)
    if "observation" not in flats:
        raise ExportError(
            f"dataset {dataset.name!r} has no single 'observation' key (it has {', '.join(flats)})",
            hint="the D4RL layout holds one observation array; export with --to torchrl or --to minari",
        )
    fields = dataset.fields
    cols = {
        "observations": ("observation", *fields["observation"]),
        "actions": ("action", *fields["action"]),
        "rewards": ("next/reward", (), fields["next/reward"][1]),
        "terminals": ("next/terminated", (), "bool"),
        "timeouts": ("next/truncated", (), "bool"),
        "next_observations": ("next/observation", *fields["observation"]),
    }
    for key in [*step_keys(dataset), *(k for k in flats if k != "observation")]:
        name = "infos/" + (key[len("info/") :] if key.startswith("info/") else key.replace("/", "_"))
        if name in cols:  # e.g. goal/x and info/goal_x: one array would hold the other's numbers
            raise ExportError(
                f"{dataset.name}: the keys {cols[name][0]!r} and {key!r} are both written as {name!r} in "
                "the D4RL layout",
                hint="export with --to torchrl or --to robomimic, which keep every key as it is, or rename "
                "one (rlds preprocess NAME --fn ...)",
            )
        cols[name] = (key, *fields[key])
    return cols


def _chunks(dataset: Dataset, key: str, shape: tuple[int, ...]) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, dataset.num_steps, CHUNK_STEPS):
        stop = min(start + CHUNK_STEPS, dataset.num_steps)
        data = dataset.gather(np.arange(start, stop), [key])[key]
        yield start, data.reshape(stop - start, *shape)


def export_d4rl(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as one D4RL-layout HDF5 file at ``out``."""
    import h5py

    columns = _columns(dataset)
    n = dataset.num_steps
    need = raw_bytes(dataset, {key: n for key, _, _ in columns.values()})
    with (
        atomic_target(out, overwrite=overwrite, need=need, folder=None, begins=(HDF5_SIGNATURE,)) as tmp,
        h5py.File(tmp, "w") as f,
    ):
        for name, (key, shape, dtype) in columns.items():
            target = f.create_dataset(name, shape=(n, *shape), dtype=np.dtype(dtype))
            for start, data in _chunks(dataset, key, shape):
                target[start : start + len(data)] = data
        _write_source_metadata(f, dataset.source_metadata)
        f.attrs["exported_by"] = "rlds-cli"
        f.attrs["source_dataset"] = dataset.name
        if progress:  # every step is in once all columns are: an error here publishes nothing
            progress(n)
    return out


def _write_source_metadata(f: Any, meta: dict[str, Any]) -> None:
    """A D4RL source's metadata, put back where the D4RL reader found it: ``metadata/<p>``
    datasets, the ``metadata`` group's and each dataset's attributes (``path@attr``), the file's
    (``@attr``). Other sources' metadata has no place in the layout; a value h5py cannot store
    (a nested mapping) is left out."""
    import h5py

    def value_of(value: Any) -> Any:
        if isinstance(value, str):
            return value
        array = np.asarray(value)
        if array.dtype.kind == "U":  # a list of texts: HDF5's variable-length strings
            return array.astype(object).astype(h5py.string_dtype())
        return array

    kept = {
        k: v for k, v in meta.items() if k.split("@", 1)[0] in ("", "metadata") or k.startswith("metadata/")
    }
    for key, value in sorted(kept.items(), key=lambda item: "@" in item[0]):  # datasets, then attributes
        path, _, attr = key.partition("@")
        try:
            if not attr:
                f.create_dataset(path, data=value_of(value))
            elif path == "":
                f.attrs[attr] = value_of(value)
            else:
                (f[path] if path in f else f.require_group(path)).attrs[attr] = value_of(value)
        except (TypeError, ValueError):
            continue  # an object array, a nested mapping: no HDF5 value


def export_npz(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write the same arrays as :func:`export_d4rl` into one uncompressed ``.npz``, streamed
    array by array (never a whole array in memory)."""
    columns = _columns(dataset)
    n = dataset.num_steps
    target = atomic_target(out, overwrite=overwrite, folder=None, begins=NPZ_SIGNATURES)
    with target as tmp, zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
        for name, (key, shape, dtype) in columns.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                header = {
                    "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                    "fortran_order": False,
                    "shape": (n, *shape),
                }
                np.lib.format.write_array_header_2_0(fh, header)
                for _, data in _chunks(dataset, key, shape):
                    fh.write(np.ascontiguousarray(data, dtype=np.dtype(dtype)).data.cast("B"))
        if progress:  # every step is in once all arrays are: an error here publishes nothing
            progress(n)
    return out
