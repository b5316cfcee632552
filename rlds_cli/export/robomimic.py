"""Export a cached dataset as one robomimic HDF5 file, the layout robomimic's ``SequenceDataset``
(and LIBERO's and RoboCasa's training code) loads.

What is written (``docs/formats.md``, "robomimic / LIBERO / RoboCasa HDF5"):

* One group ``data/demo_<N>`` per episode, in the dataset's order; ``N`` is the episode's source id
  when those rise and are >= 0 (a converted robomimic file keeps its demo names), else its
  position (readers order demos by number).
* ``actions`` (``action``), ``rewards`` (``next/reward``, one value a step), ``dones``
  (``info/dones`` when the dataset has it, its last step made the episode's ending where they
  disagree (a trimmed or downsampled dataset), else ``next/terminated`` as int64, as robomimic
  writes it), ``obs/<k>`` and ``next_obs/<k>`` (``observation/<k>``; another observation-like key ``K`` is
  ``obs/K`` with ``/`` as ``_``; ``next_obs`` ends with the final observation, and is left out when
  no episode's final observation is known, as in a LIBERO file), and ``<k>`` for every other
  per-step key ``info/<k>`` (``states``, ``robot_states``, ...).
* Per demo: ``num_samples`` and the attributes the source kept (``model_file``, ``ep_meta``,
  LIBERO's ``init_state``); on ``data``: the source's attributes (``env_args`` and the rest),
  ``total`` counted anew; ``env_args`` made from the recorded environment (``type`` 2, gym) or the
  dataset's name when the source had none.
* Language instructions the source's attributes do not carry (a step column: an RLDS source's
  ``language_instruction``, a LeRobot source's tasks; a merge of LIBERO files of several tasks):
  a demo with one instruction gets RoboCasa's ``ep_meta`` ``{"lang": ...}`` (unless the source
  kept an ``ep_meta``), a file whose demos all have the same one LIBERO's
  ``problem_info`` ``{"language_instruction": ...}``; a demo whose instruction changes mid-demo has
  only the index column (robomimic has no place for a text per step).
* Filter keys: ``mask/<key>`` for each of the dataset's filter keys, the names of its demos, as
  ``np.array(names, dtype="S")`` (robomimic's ``create_hdf5_filter_key``).

Written through a temporary name and renamed into place; data is read in chunks of about
:data:`CHUNK_BYTES` (bounded memory). ``final_known`` flags are not written (robomimic has no place
for them): where only some final observations are known, the unknown ones are exported as stored
(the last observation repeated).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import filter_key_episodes, filter_key_names
from rlds_cli.errors import ExportError, InvalidSelectionError
from rlds_cli.export import HDF5_SIGNATURE, atomic_target, flat_keys, raw_bytes, step_keys

#: Bytes of data read from the cache at a time.
CHUNK_BYTES = 64 << 20
#: Per-episode source arrays written back as demo attributes (``lang`` is part of ``ep_meta``).
_NOT_ATTRS = {"lang", "num_samples"}


def _plan(dataset: Dataset) -> tuple[dict[str, str], dict[str, str]]:
    """(robomimic dataset path -> TED key for step data, obs name -> TED key)."""
    steps = {"actions": "action", "rewards": "next/reward"}
    stored = step_keys(dataset)
    steps["dones"] = "info/dones" if "info/dones" in stored else "next/terminated"
    for key in stored:
        if key == "info/dones":
            continue
        name = key[len("info/") :] if key.startswith("info/") else key.replace("/", "_")
        if name in steps or name.startswith(("obs/", "next_obs/")) or name in ("obs", "next_obs"):
            raise ExportError(
                f"dataset {dataset.name!r}: key {key!r} would be written as {name!r}, which robomimic uses "
                "for another array",
                hint="export with --to torchrl, or convert the dataset with the key renamed",
            )
        steps[name] = key
    obs: dict[str, str] = {}
    for key in flat_keys(dataset):
        name = key[len("observation/") :] if key.startswith("observation/") else key.replace("/", "_")
        if name in obs:
            raise ExportError(f"dataset {dataset.name!r}: {key!r} and {obs[name]!r} both become obs/{name}")
        obs[name] = key
    if not obs:
        raise ExportError(
            f"dataset {dataset.name!r} has no observation key (robomimic demos need obs/*)",
            hint="export with --to torchrl or --to d4rl",
        )
    return steps, obs


def _demo_names(dataset: Dataset) -> list[str]:
    """``demo_<source id>`` where the ids rise (the source's own names, e.g. a view of a robomimic
    file), else ``demo_<position>``: robomimic's readers (and rlds's) order demos by number, so
    any other ids (a merge's parts) would read back in another order."""
    ids = [int(i) for i in dataset.episode_index["source_id"]]
    if all(i >= 0 for i in ids) and all(a < b for a, b in itertools.pairwise(ids)):
        return [f"demo_{i}" for i in ids]
    return [f"demo_{i}" for i in range(len(ids))]


def _attr(value: Any) -> Any:
    """A JSON value of the manifest back as an HDF5 attribute: a list of numbers as an array, of
    strings as byte strings (as robomimic writes its lists), anything else HDF5 has no type for as
    its JSON text."""
    if isinstance(value, dict):
        return json.dumps(value)
    if not isinstance(value, list):
        return value
    if value and all(isinstance(v, str) for v in value):
        return np.array([v.encode("utf-8") for v in value])
    array = np.asarray(value) if all(isinstance(v, bool | int | float) for v in value) else None
    return array if array is not None and array.dtype.kind in "biuf" else json.dumps(value)


def _env_args(dataset: Dataset) -> str:
    spec = dataset.env_spec
    env = {
        "env_name": spec.id if spec is not None else dataset.name,
        "type": 2,  # robomimic's EnvType.GYM_TYPE
        "env_kwargs": dict(spec.kwargs) if spec is not None else {},
    }
    return json.dumps(env, indent=4)


def _masks(dataset: Dataset, names: list[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key in filter_key_names(dataset):
        try:
            ids = filter_key_episodes(dataset, key)
        except InvalidSelectionError:  # a key holding none of this dataset's episodes stays, empty
            ids = np.zeros(0, np.int64)
        out[key] = np.array([names[i] for i in ids], dtype="S")
    return out


def export_robomimic(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as one robomimic HDF5 file at ``out`` (see the module docstring)."""
    import h5py

    steps, obs = _plan(dataset)
    fields = dataset.fields
    names = _demo_names(dataset)
    masks = _masks(dataset, names)
    index = dataset.episode_index
    # no episode's final observation known (a LIBERO-style source): no next_obs, as the source had
    # none, so a reader marks the final observations unknown again
    with_next = bool(index["final_known"].any())
    keys = [*steps.values(), *obs.values(), *(f"next/{k}" for k in obs.values() if with_next)]
    row_bytes = raw_bytes(dataset, dict.fromkeys(keys, 1))
    chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    source = dataset.source_metadata.get("robomimic")
    attrs = dict(source.get("attrs", {})) if isinstance(source, dict) else {}
    # instructions the source's own attributes do not carry (a step column of an RLDS or LeRobot
    # source, a merge of LIBERO files of several tasks): RoboCasa's and LIBERO's places
    instructions = dataset.instructions
    kept = source.get("language_instruction") if isinstance(source, dict) else None  # problem_info's
    langs: set[str | None] = set()  # each demo's one instruction (None: it changes mid-demo)
    # robomimic's dones are int64: a bool next/terminated is written 8 times as wide as it is read
    widened = {"next/terminated": "<i8"}
    need = raw_bytes(dataset, dict.fromkeys(keys, dataset.num_steps), widened)
    arrays = dataset.episode_source_arrays()  # each demo's attributes: read once
    with (
        atomic_target(out, overwrite=overwrite, need=need, folder=None, begins=(HDF5_SIGNATURE,)) as tmp,
        h5py.File(tmp, "w") as f,
    ):
        data = f.create_group("data")
        for i, name in enumerate(names):
            start, length = int(index["start"][i]), int(index["length"][i])
            grp = data.create_group(name)
            targets: dict[str, Any] = {}
            for path, key in steps.items():
                shape, dtype = fields[key]
                shape = () if path in ("rewards", "dones") and shape == (1,) else shape
                dtype = widened.get(key, dtype)
                targets[key] = grp.create_dataset(path, shape=(length, *shape), dtype=np.dtype(dtype))
            for name_, key in obs.items():
                shape, dtype = fields[key]
                targets[key] = grp.create_dataset(
                    f"obs/{name_}", shape=(length, *shape), dtype=np.dtype(dtype)
                )
                if with_next:
                    targets[f"next/{key}"] = grp.create_dataset(
                        f"next_obs/{name_}", shape=(length, *shape), dtype=np.dtype(dtype)
                    )
            for a in range(0, length, chunk):
                b = min(length, a + chunk)
                batch = dataset.gather(np.arange(start + a, start + b), keys)
                for key, target in targets.items():
                    target[a:b] = np.asarray(batch[key], target.dtype).reshape(b - a, *target.shape[1:])
            if steps["dones"] == "info/dones":  # a demo whose last dones is not 0 reads as terminated
                last = dataset.gather(np.array([start + length - 1]), ["next/terminated"])["next/terminated"]
                if bool(np.asarray(targets["info/dones"][-1]).any()) != bool(last.any()):
                    targets["info/dones"][-1] = int(last.any())
            grp.attrs["num_samples"] = length
            for key, value in dataset.episode_metadata(i, arrays).items():
                prefix, _, what = key.partition("/")
                if prefix == "robomimic" and what not in _NOT_ATTRS and value is not None:
                    grp.attrs[what] = _attr(value)
            if instructions is not None and "ep_meta" not in grp.attrs:
                used = np.unique(instructions.of_steps(dataset, i, slice(start, start + length)))
                lang = instructions.texts[int(used[0])] if len(used) == 1 else None
                langs.add(lang)
                if lang and lang != kept:  # one instruction for the demo: RoboCasa's ep_meta["lang"]
                    grp.attrs["ep_meta"] = json.dumps({"lang": lang})
            if progress:
                progress(length)
        for key, mask in masks.items():
            f[f"mask/{key}"] = mask
        for key, value in attrs.items():
            data.attrs[key] = _attr(value)
        data.attrs["total"] = int(index["length"].sum())
        if "num_demos" in attrs:
            data.attrs["num_demos"] = len(names)
        if "env_args" not in attrs:
            data.attrs["env_args"] = _env_args(dataset)
        (common,) = langs if len(langs) == 1 else (None,)
        if common and "problem_info" not in attrs:  # one for every demo: LIBERO's place
            data.attrs["problem_info"] = json.dumps({"language_instruction": common})
    return out
