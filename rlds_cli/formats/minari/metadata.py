"""Minari's metadata: the dataset's ``data/metadata.json`` (JSON strings inside it decoded) and
each episode's ``seed``, kept exactly as a uint64 or noted as absent."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.json_files import read_json_file
from rlds_cli.formats.minari.layout import METADATA_FILE

#: The largest seed a Minari episode can carry (``DataCollector`` draws 64 random bits).
SEED_MAX = 2**64 - 1
#: metadata.json entries that are JSON strings inside the JSON.
_JSON_STRING_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")
#: metadata.json entries kept under the manifest's ``source.metadata.spaces`` (not ``minari``).
SPACE_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")


def read_metadata(data_dir: Path) -> dict[str, Any]:
    """``data/metadata.json`` as a dict, the JSON strings inside it (spaces, env specs) decoded;
    the two spaces must be JSON objects when present."""
    meta_path = data_dir / METADATA_FILE
    if not meta_path.is_file():
        raise SourceFormatError(
            f"{data_dir} is not a Minari dataset: no {METADATA_FILE}",
            hint="pass the dataset directory (the one holding data/metadata.json)",
        )
    meta = read_json_file(meta_path)
    if not isinstance(meta, dict):
        raise SourceFormatError(f"{meta_path}: expected a JSON object")
    for key in _JSON_STRING_KEYS:
        value = meta.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # not JSON: keep the raw string
                meta[key] = json.loads(value)
    for key in ("observation_space", "action_space"):  # read to plan the arrays: must be objects
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise SourceFormatError(
                f"{meta_path}: {key!r} is not a JSON object (minari's serialized space): {str(value)[:60]!r}",
                hint="re-create the dataset with minari, or fix the named entry of metadata.json",
            )
    return meta


def as_seed(raw: Any) -> int | None:
    """``raw`` as a seed: an integer in ``[0, 2**64 - 1]`` (one value), else ``None``."""
    if isinstance(raw, bool):
        return None
    value = np.asarray(raw) if not isinstance(raw, int) else raw
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind not in "iu":
            return None
        value = int(value.reshape(-1)[0])
    return value if 0 <= value <= SEED_MAX else None
