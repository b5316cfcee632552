"""Export to a Minari HDF5 dataset directory (``<out>/data/main_data.hdf5`` + ``metadata.json``).

Each episode becomes an ``episode_{i}`` group: ``observations`` with T+1 rows (the episode's
observations and its final one), ``actions``, ``rewards``, ``terminations`` and ``truncations``
with T rows, and an ``infos`` group (``info/<k>`` keys). Spaces are serialised with Minari's own
serializer, so ``minari`` (and gymnasium) must be installed. Load the result with
``MINARI_DATASETS_PATH=<out's parent> minari.load_dataset("<out's name>")``, or convert it back
with ``rlds download <out>``.

Spaces (rules in ``docs/formats.md``, "Export to Minari"):

* A dataset converted from Minari gets its source spaces back (kept in the manifest's
  ``source.metadata.spaces`` at conversion; a view looks them up in its parent): Discrete ``n``
  and ``start``, Box bounds, MultiDiscrete, MultiBinary, Tuple and Dict as they were, each array
  written back at its source path (``observations/_index_0``, ``actions/goal``), and the
  ``env_spec`` so ``recover_environment()`` works (a dataset whose manifest records an ``env``,
  :mod:`rlds_cli.cache.env_spec`, gets that one). They are used when the stored keys, shapes
  and dtypes still match them, else the space of that role is inferred as below.
* Otherwise spaces are inferred from the stored arrays: ``observation/<k>`` keys make a Dict,
  floats an unbounded Box, integers a Box over their dtype's range, bools a ``bool`` Box, an
  integer scalar action a Discrete from its smallest to its largest value.
* A dataset recorded by ``rlds_cli.record`` keeps its spaces the same way (``recording/``); its
  Text leaves, stored as ``uint32`` code points, are written back as the UTF-8 strings minari
  stores for a Text space, and the reset seed of each episode as the episode's ``seed``
  attribute (as ``DataCollector`` writes it).
* Reference scores (:func:`rlds_cli.catalog.scores.dataset_scores`: a Minari source's, a D4RL
  id's from the registry) are written as ``ref_min_score``/``ref_max_score``, where Minari's
  ``get_normalized_score`` reads them.
* Images: when every image leaf (minari's ``is_image_space``) is a JPEG frame column of the
  dataset (``--frames keep`` of a minari source, or ``--frames jpeg``), each frame's stored bytes
  are written as minari writes its frames (one JPEG a row, a variable-length ``uint8`` dataset)
  and ``jpeg_encoding`` is true: nothing is decoded or encoded again, and minari decodes exactly
  what rlds reads. Otherwise images are written as raw ``uint8`` arrays and ``jpeg_encoding`` is
  false, so minari reads them back without JPEG decoding (lossless).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episode_table import SEED_KEY, SEED_PRESENT_KEY
from rlds_cli.cache.layout import VIEW_LAYOUT
from rlds_cli.cache.manifest import FieldSpec, read_manifest
from rlds_cli.cache.views import ViewSpec
from rlds_cli.catalog.scores import dataset_scores
from rlds_cli.errors import ExportError, RldsError, import_extra
from rlds_cli.export import atomic_target, flat_keys, raw_bytes, refuse_unwritten, step_keys

_ID = re.compile(r"^[A-Za-z0-9_.-]+-v\d+$")
#: Where each role's arrays live in a Minari episode group.
_PREFIX = {"observation": "observations", "action": "actions"}


def source_spaces(dataset: Dataset) -> dict[str, Any] | None:
    """The spaces kept at conversion from a Minari source (``source.metadata.spaces``), looked up
    in the parent for a view; ``None`` when the dataset did not come from Minari."""
    manifest = dataset.manifest
    if manifest.layout == VIEW_LAYOUT:
        view = ViewSpec.from_manifest(manifest)
        try:
            manifest = read_manifest(dataset.directory.parent / view.parent.replace("/", "--"))
        except (OSError, ValueError, RldsError):
            return None
        if manifest.digest() != view.parent_digest:  # the parent was replaced since
            return None
    metadata = manifest.source.get("metadata")
    spaces = metadata.get("spaces") if isinstance(metadata, dict) else None
    if isinstance(spaces, dict) and spaces.get("serializer") == "minari":
        return spaces
    return None


def _leaves(gym: Any, space: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(HDF5 path, leaf space)`` of a space, with Minari's group names (``_index_<i>``)."""
    if isinstance(space, gym.spaces.Dict):
        for name, sub in space.spaces.items():
            yield from _leaves(gym, sub, f"{path}/{name}")
    elif isinstance(space, gym.spaces.Tuple):
        for j, sub in enumerate(space.spaces):
            yield from _leaves(gym, sub, f"{path}/_index_{j}")
    else:
        yield path, space


def _fits(gym: Any, space: Any, spec: FieldSpec) -> bool:
    """Whether stored arrays of ``spec`` are values of the leaf ``space``."""
    dtype = np.dtype(spec.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return spec.shape == () and dtype.kind in "iu"
    if isinstance(space, gym.spaces.Box):
        return spec.shape == tuple(space.shape) and dtype == space.dtype
    if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return spec.shape == tuple(space.shape) and dtype.kind in "iub"
    if isinstance(space, gym.spaces.Text):  # recorded text: uint32 code points (recording/episode.py)
        return spec.shape == (space.max_length,) and dtype == np.uint32
    return False


def _recorded_space(
    gym: Any, role: str, keys: list[str], fields: dict[str, FieldSpec], recorded: dict[str, Any] | None
) -> tuple[Any, dict[str, str]] | None:
    """The source space of ``role`` and the source path of each key, if it still fits the data."""
    from minari.serialization import deserialize_space

    source = (recorded or {}).get(f"{role}_space")
    if not isinstance(source, dict):
        return None
    try:
        space = deserialize_space(json.dumps(source))
    except Exception:  # a space this minari/gymnasium cannot build: infer one instead
        return None
    paths = (recorded or {}).get("paths") or {}
    key_of = {p: k for k, p in paths.items() if k in keys}
    leaves = list(_leaves(gym, space, _PREFIX[role]))
    if {p for p, _ in leaves} != set(key_of) or set(key_of.values()) != set(keys):
        return None
    if not all(_fits(gym, leaf, fields[key_of[p]]) for p, leaf in leaves):
        return None
    return space, {key_of[p]: p for p, _ in leaves}


def _inferred_leaf(gym: Any, spec: FieldSpec, values: Any = None) -> Any:
    dtype = np.dtype(spec.dtype)
    shape = spec.shape
    if dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype.kind in "iu" and shape == () and values is not None and len(values):
        low, high = int(np.min(values)), int(np.max(values))
        return gym.spaces.Discrete(high - low + 1, start=low)
    if dtype.kind == "b":  # gymnasium's bool Box: the stored dtype, values False..True
        return gym.spaces.Box(0, 1, shape, np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return gym.spaces.Box(info.min, info.max, shape, dtype)
    raise ExportError(f"key {spec.key!r} has dtype {dtype}, which no Minari space holds")


def _inferred_space(
    gym: Any, role: str, keys: list[str], fields: dict[str, FieldSpec], dataset: Dataset
) -> tuple[Any, dict[str, str]]:
    """A space built from the stored arrays: one leaf, or a Dict nested by ``/``."""
    prefix = _PREFIX[role]

    def leaf(key: str) -> Any:
        values = np.asarray(dataset.column(key)) if role == "action" else None
        return _inferred_leaf(gym, fields[key], values)

    if keys == [role]:
        return leaf(role), {role: prefix}
    tree: dict[str, Any] = {}
    for key in keys:
        *parents, name = key.split("/")[1:]
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf(key)

    def build(node: dict[str, Any]) -> Any:
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree), {key: prefix + key[len(role) :] for key in keys}


def _role_space(
    gym: Any, role: str, dataset: Dataset, recorded: dict[str, Any] | None
) -> tuple[Any, dict[str, str]]:
    fields = dataset.stored_fields
    keys = sorted(k for k in fields if k == role or k.startswith(f"{role}/"))
    if not keys:
        raise ExportError(f"dataset {dataset.name!r} has no {role!r} key to export")
    found = _recorded_space(gym, role, keys, fields, recorded)
    return found if found is not None else _inferred_space(gym, role, keys, fields, dataset)


def _write_leaf(group: Any, path: str, data: np.ndarray, text_paths: set[str]) -> None:
    """One leaf of an episode; a Text leaf as UTF-8 strings, which minari's reader decodes."""
    if path in text_paths:
        import h5py

        from rlds_cli.recording.episode import decode_text

        strings = [s.encode("utf-8") for s in decode_text(np.asarray(data))]
        group.create_dataset(path, data=strings, dtype=h5py.string_dtype(encoding="utf-8"))
    else:
        group.create_dataset(path, data=data)


def _kept_jpeg(gym: Any, dataset: Dataset, space: Any, paths: dict[str, str]) -> dict[str, Any]:
    """The JPEG frame columns to write as they are stored, by key: every observation leaf that
    minari takes for an image (``is_image_space``), when each is one (``jpeg_encoding`` holds for
    the whole file); else none."""
    from minari.dataset.minari_storage import is_image_space

    leaves = dict(_leaves(gym, space, "observations"))
    images = [key for key, path in paths.items() if is_image_space(leaves[path])]
    kept: dict[str, Any] = {}
    for key in images:
        spec = dataset.stored_fields.get(key)
        column = dataset.column(key) if spec is not None and spec.codec == "jpeg" else None
        # a view's, merge's or growing dataset's column too, where its parts give rows as stored
        rgb_or_gray = spec is not None and not spec.channels_first and spec.shape[2:] in ((), (3,))
        if spec is None or column is None or getattr(column, "stored_format", None) != spec.frame_format:
            return {}
        if not rgb_or_gray:
            return {}
        kept[key] = column
    return kept


def _spec_json(value: Any) -> str | None:
    """An env spec as metadata.json holds it (a JSON string)."""
    if isinstance(value, dict):
        return json.dumps(value)
    return value if isinstance(value, str) else None


def export_minari(
    dataset: Dataset,
    out: Path,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    dataset_id: str | None = None,
) -> Path:
    """Write ``dataset`` as a Minari HDF5 dataset directory at ``out``."""
    hint = "pip install 'minari[hdf5]' gymnasium"
    gym = import_extra("gymnasium", "exporting to Minari", hint=hint)
    minari = import_extra("minari", "exporting to Minari", hint=hint)
    serialize_space = import_extra("minari.serialization", "exporting to Minari", hint=hint).serialize_space
    import h5py

    dataset_id = dataset_id or (out.name if _ID.match(out.name) else None)
    if dataset_id is None:
        raise ExportError(
            f"{out.name!r} is not a Minari dataset id (NAME-vN)",
            hint="name the output directory like 'my-dataset-v0'; Minari loads it by that name",
        )
    refuse_unwritten(
        dataset,
        "a Minari dataset",
        lambda k: k == "observation" or k.startswith(("observation/", "action/", "info/")),
    )
    recorded = source_spaces(dataset)
    observation_space, observation_paths = _role_space(gym, "observation", dataset, recorded)
    action_space, action_paths = _role_space(gym, "action", dataset, recorded)
    # Text leaves (recorded as code points) are written back as the strings minari stores
    text_paths = {
        path
        for space, prefix in ((observation_space, "observations"), (action_space, "actions"))
        for path, leaf in _leaves(gym, space, prefix)
        if isinstance(leaf, gym.spaces.Text)
    }
    jpeg = _kept_jpeg(gym, dataset, observation_space, observation_paths)
    recorded_paths = (recorded or {}).get("paths") or {}
    info_paths = {
        k: recorded_paths.get(k, "infos" + k[len("info") :])
        for k in [*flat_keys(dataset), *step_keys(dataset)]
        if k.startswith("info/")
    }
    # observations hold each episode's final one too; kept JPEG files are written as stored
    flat, flags = set(flat_keys(dataset)), ["next/reward", "next/terminated", "next/truncated"]
    rows = {
        k: dataset.num_steps + (dataset.num_episodes if k in flat else 0)
        for k in [*observation_paths, *action_paths, *info_paths, *flags]
        if k not in jpeg
    }
    need = raw_bytes(dataset, rows) + sum(os.path.getsize(column.path) for column in jpeg.values())
    with atomic_target(out, overwrite=overwrite, need=need, folder="data/metadata.json") as tmp:
        data_dir = tmp / "data"
        data_dir.mkdir(parents=True)
        with h5py.File(data_dir / "main_data.hdf5", "w") as f:
            for i in range(dataset.num_episodes):
                ep = dataset.episode(i)
                length = len(ep["next/reward"])
                group = f.create_group(f"episode_{i}")
                group.attrs["id"] = i
                group.attrs["total_steps"] = length
                if bool(ep.get(SEED_PRESENT_KEY, np.zeros(1, bool))[0]):
                    # a recorded episode's reset seed, where DataCollector keeps it
                    group.attrs["seed"] = np.uint64(ep[SEED_KEY][0])
                for key, path in observation_paths.items():
                    if key in jpeg:  # the episode's stored JPEG files, its final frame's too
                        first = int(dataset.episode_index["start"][i]) + i
                        stored_rows = np.arange(first, first + length + 1, dtype=np.int64)
                        files = jpeg[key].encoded_rows(stored_rows).data
                        # row by row: files of one length would make h5py write a 2-D array
                        written = group.create_dataset(path, (len(files),), dtype=h5py.vlen_dtype(np.uint8))
                        for j, data in enumerate(files):
                            written[j] = np.frombuffer(data, np.uint8)
                        continue
                    _write_leaf(group, path, np.concatenate([ep[key], ep[f"next/{key}"][-1:]]), text_paths)
                for key, path in action_paths.items():
                    _write_leaf(group, path, ep[key], text_paths)
                group.create_dataset("rewards", data=ep["next/reward"].reshape(length))
                group.create_dataset("terminations", data=ep["next/terminated"].reshape(length))
                group.create_dataset("truncations", data=ep["next/truncated"].reshape(length))
                group.create_group("infos")
                for key, path in info_paths.items():
                    value = ep[key]
                    if f"next/{key}" in ep:  # T+1 infos: the reset info plus one per step
                        value = np.concatenate([value, ep[f"next/{key}"][-1:]])
                    group.create_dataset(path, data=value)
                if progress:
                    progress(length)
        metadata: dict[str, Any] = {
            "dataset_id": dataset_id,
            "total_episodes": dataset.num_episodes,
            "total_steps": dataset.num_steps,
            "data_format": "hdf5",
            # JPEG files kept as the cache stores them, else raw uint8 arrays minari must not decode
            "jpeg_encoding": bool(jpeg),
            "observation_space": serialize_space(observation_space),
            "action_space": serialize_space(action_space),
            "algorithm_name": "exported by rlds-cli",
            "author": ["rlds-cli export"],
            "author_email": ["none@example.invalid"],
            "code_permalink": "https://pypi.org/project/rlds-cli/",
            "description": f"rlds dataset {dataset.name!r} exported to Minari",
            # Minari checks this against the versions it can read: name the installed one
            "minari_version": str(minari.__version__),
        }
        scores = dataset_scores(dataset)  # a Minari source's, a D4RL id's, a view's parent's
        if scores is not None:
            metadata["ref_min_score"], metadata["ref_max_score"] = scores.min, scores.max
        # the full gymnasium specs the dataset records (a Minari source's, or what a writer put in
        # the manifest's 'env'), so recover_environment() works; not a registry's bare D4RL id
        env = dataset.env_spec
        full = env is not None and env.source != "registry"
        specs = {"env_spec": env.raw, "eval_env_spec": env.eval_raw} if env and full else {}
        for key in ("env_spec", "eval_env_spec"):
            spec = _spec_json(specs.get(key))
            if spec is not None:
                metadata[key] = spec
        (data_dir / "metadata.json").write_text(json.dumps(metadata))
    return out
