"""RLDS / Open X-Embodiment datasets written the way TFDS writes them, without TensorFlow.

:func:`write_rlds_dataset` writes a dataset version folder: ``features.json`` in TFDS's exact
JSON schema (the ``Feature`` protobuf as ``json_format`` writes it: camelCase names, int64s as
strings, ``pythonClassName`` on every node), ``dataset_info.json`` (name, version, splits with
``shardLengths``, ``filepathTemplate``) and the shards ``<name>-<split>.tfrecord-0000i-of-0000n``.
Each episode is one ``tf.train.Example`` serialized by the real ``protobuf`` runtime through the
``tfrecord`` package's writer (its own framing and masked crc32c), so the reader is checked
against bytes it did not write. The features are shaped like a real OXE dataset: a PNG camera
``image`` and a JPEG ``wrist_image``, an 8-d ``state``, a 7-d float ``action`` (or a dict action
like RT-1's ``fractal20220817_data``), ``reward`` and ``discount`` as float64 scalars (stored as
float32, TFDS's cast), ``is_first``/``is_last``/``is_terminal``, ``language_instruction``,
``language_embedding`` (512 float32) and ``episode_metadata/file_path``.

The raw values are returned (:class:`Episode`) for independent expectations; PNG frames are
random (lossless), JPEG frames are kept as their encoded bytes (compare with Pillow's decoding).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_FEATURES = "tensorflow_datasets.core.features"
Datum = dict[str, tuple[Any, str]]


@dataclass
class Episode:
    """The raw values of one written episode (``T`` steps)."""

    image: np.ndarray  # (T, S, S, 3) uint8, stored as PNG
    wrist_jpeg: list[bytes]  # T JPEG byte strings (S, S, 3)
    state: np.ndarray  # (T, 8) float32
    action: dict[str, np.ndarray]  # "" -> (T, 7) float32, or the dict action's parts
    reward: np.ndarray  # (T,) float64 (written as float32)
    discount: np.ndarray  # (T,) float64
    is_first: np.ndarray
    is_last: np.ndarray
    is_terminal: np.ndarray
    instruction: list[str]
    embedding: np.ndarray  # (T, 512) float32
    file_path: str

    @property
    def steps(self) -> int:
        return len(self.state)


@dataclass
class Fixture:
    root: Path
    episodes: list[Episode]
    shards: list[Path]
    shard_episodes: list[list[int]] = field(default_factory=list)


def _tensor(
    shape: Sequence[int], dtype: str, cls: str = "tensor_feature.Tensor", doc: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {"dtype": dtype, "encoding": "none"}
    spec["shape"] = {"dimensions": [str(d) for d in shape]} if shape else {}
    return {"pythonClassName": f"{_FEATURES}.{cls}", "tensor": spec, "description": doc}


def _scalar(dtype: str, doc: str) -> dict[str, Any]:
    return _tensor((), dtype, "scalar.Scalar", doc)


def _image(side: int, fmt: str, doc: str) -> dict[str, Any]:
    return {
        "pythonClassName": f"{_FEATURES}.image_feature.Image",
        "image": {
            "shape": {"dimensions": [str(side), str(side), "3"]},
            "dtype": "uint8",
            "encodingFormat": fmt,
        },
        "description": doc,
    }


def _text(doc: str) -> dict[str, Any]:
    return {"pythonClassName": f"{_FEATURES}.text_feature.Text", "text": {}, "description": doc}


def _dict(features: dict[str, Any]) -> dict[str, Any]:
    return {
        "pythonClassName": f"{_FEATURES}.features_dict.FeaturesDict",
        "featuresDict": {"features": features},
    }


DICT_ACTION = {
    "world_vector": (3,),
    "rotation_delta": (3,),
    "gripper_closedness_action": (1,),
    "terminate_episode": (),
}


def features_json(
    side: int, *, dict_action: bool = False, state_name: str = "state", state_dim: int = 8
) -> dict[str, Any]:
    """The ``features.json`` of the fixture, as TFDS writes it."""
    if dict_action:
        action = _dict({k: _tensor(s, "float32") for k, s in DICT_ACTION.items()})
    else:
        action = _tensor((7,), "float32", doc="Robot action: 3x EEF delta, 3x rotation delta, 1x gripper.")
    steps = _dict(
        {
            "action": action,
            "discount": _scalar("float64", "Discount if provided, default to 1."),
            "is_first": _scalar("bool", "True on first step of the episode."),
            "is_last": _scalar("bool", "True on last step of the episode."),
            "is_terminal": _scalar("bool", "True on last step of the episode if it is a terminal step."),
            "language_embedding": _tensor((512,), "float32", doc="Kona language embedding."),
            "language_instruction": _text("Language Instruction."),
            "observation": _dict(
                {
                    "image": _image(side, "png", "Main camera RGB observation."),
                    state_name: _tensor((state_dim,), "float32", doc="Robot state."),
                    "wrist_image": _image(side, "jpeg", "Wrist camera RGB observation."),
                }
            ),
            "reward": _scalar("float64", "Reward if provided, 1 on final step for demos."),
        }
    )
    return _dict(
        {
            "episode_metadata": _dict({"file_path": _text("Path to the original data file.")}),
            "steps": {
                "pythonClassName": f"{_FEATURES}.dataset_feature.Dataset",
                "sequence": {"feature": steps, "length": "-1"},
            },
        }
    )


def encode(frame: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(frame).save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def make_episode(
    rng: np.random.Generator,
    steps: int,
    side: int,
    *,
    index: int,
    transition: bool,
    dict_action: bool,
    terminal: bool,
    constant: bool = False,
) -> Episode:
    """Random values of one episode; the last step's action and reward are zero unless
    ``transition`` (strict RLDS) ; ``constant``: all-zero frames (tiny once encoded)."""
    if constant:
        image = np.zeros((steps, side, side, 3), np.uint8)
        wrist = [encode(image[0], "JPEG")] * steps
    else:
        image = rng.integers(0, 256, (steps, side, side, 3), dtype=np.uint8)
        yy, xx = np.mgrid[0:side, 0:side]
        wrist = [
            encode(
                np.stack([(xx + 3 * t) % 256, (yy + 5 * t) % 256, (xx + yy + index) % 256], -1).astype(
                    np.uint8
                ),
                "JPEG",
            )
            for t in range(steps)
        ]
    if dict_action:
        action = {k: rng.standard_normal((steps, *s)).astype(np.float32) for k, s in DICT_ACTION.items()}
    else:
        action = {"": rng.standard_normal((steps, 7)).astype(np.float32)}
    reward = rng.random(steps)
    if not transition:  # strict RLDS: the last step carries the final observation only
        for part in action.values():
            part[-1] = 0
        reward[-1] = 0.0
    flags = np.zeros(steps, bool)
    first, last = flags.copy(), flags.copy()
    first[0] = last[-1] = True
    return Episode(
        image=image,
        wrist_jpeg=wrist,
        state=rng.standard_normal((steps, 8)).astype(np.float32),
        action=action,
        reward=reward,
        discount=np.ones(steps),
        is_first=first,
        is_last=last,
        is_terminal=last & terminal,
        instruction=[["pick up the red block", "open the drawer", "wipe the table"][index % 3]] * steps,
        embedding=rng.standard_normal((steps, 512)).astype(np.float32),
        file_path=f"/data/raw/episode_{index:04d}.npy",
    )


def datum(ep: Episode, *, state_name: str = "state", constant: bool = False) -> Datum:
    """The Example features of an episode, as TFDS flattens them (``steps/...`` along time);
    ``constant``: every frame is the first one (encoded once)."""
    pngs = [encode(ep.image[0], "PNG")] * ep.steps if constant else [encode(f, "PNG") for f in ep.image]
    out: Datum = {
        "episode_metadata/file_path": ([ep.file_path.encode()], "byte"),
        "steps/discount": (ep.discount.astype(np.float32).tolist(), "float"),
        "steps/is_first": (ep.is_first.astype(int).tolist(), "int"),
        "steps/is_last": (ep.is_last.astype(int).tolist(), "int"),
        "steps/is_terminal": (ep.is_terminal.astype(int).tolist(), "int"),
        "steps/language_embedding": (ep.embedding.reshape(-1).tolist(), "float"),
        "steps/language_instruction": ([s.encode() for s in ep.instruction], "byte"),
        "steps/observation/image": (pngs, "byte"),
        f"steps/observation/{state_name}": (ep.state.reshape(-1).tolist(), "float"),
        "steps/observation/wrist_image": (list(ep.wrist_jpeg), "byte"),
        "steps/reward": (ep.reward.astype(np.float32).tolist(), "float"),
    }
    for key, part in ep.action.items():
        out["steps/action" + (f"/{key}" if key else "")] = (part.reshape(-1).tolist(), "float")
    return out


def write_rlds_dataset(
    root: Path,
    lengths: Sequence[int] = (5, 7, 4),
    *,
    side: int = 16,
    shards: int = 1,
    last_step: str = "observation",
    dict_action: bool = False,
    name: str = "oxe_fixture",
    split: str = "train",
    seed: int = 0,
    constant: bool = False,
    terminal: bool = True,
    state_name: str = "state",
    mutate: Callable[[int, Datum], None] | None = None,
) -> Fixture:
    """Write an RLDS dataset of ``len(lengths)`` episodes into ``root`` (created).

    Args:
        lengths: Steps of each episode.
        side: Frame side of both cameras.
        shards: Shards to spread the episodes over (round-robin blocks, in order).
        last_step: ``"observation"`` (strict RLDS: zero action and reward on the last step),
            ``"transition"`` (a real action and reward there) or ``"mixed"`` (alternating).
        dict_action: A dict action (``world_vector``, ``rotation_delta``, ...).
        constant: All-zero frames (for large, tiny-on-disk sources).
        terminal: Whether episodes end with ``is_terminal`` set.
        state_name: The state observation's name (for hostile names).
        mutate: Called with each episode's index and Example features before it is written.
    """
    from tfrecord import TFRecordWriter

    root.mkdir(parents=True, exist_ok=True)
    (root / "features.json").write_text(
        json.dumps(features_json(side, dict_action=dict_action, state_name=state_name), indent=4)
    )
    rng = np.random.default_rng(seed)
    per_shard = np.array_split(np.arange(len(lengths)), shards)
    fixture = Fixture(root, [], [], [list(map(int, p)) for p in per_shard])
    constant_episode: Episode | None = None
    for s, indices in enumerate(per_shard):
        path = root / f"{name}-{split}.tfrecord-{s:05d}-of-{shards:05d}"
        writer = TFRecordWriter(str(path))
        for i in indices:
            transition = last_step == "transition" or (last_step == "mixed" and i % 2 == 1)
            if constant and constant_episode is not None and constant_episode.steps == lengths[i]:
                ep = constant_episode  # the same values again: a large source written fast
            else:
                ep = make_episode(
                    rng,
                    lengths[i],
                    side,
                    index=int(i),
                    transition=transition,
                    dict_action=dict_action,
                    terminal=terminal,
                    constant=constant,
                )
                constant_episode = ep if constant else None
            features = datum(ep, state_name=state_name, constant=constant)
            if mutate is not None:
                mutate(int(i), features)
            writer.write(features)
            fixture.episodes.append(ep)
        writer.close()
        fixture.shards.append(path)
    info = {
        "citation": "",
        "description": "A small dataset shaped like an Open X-Embodiment one.",
        "fileFormat": "tfrecord",
        "moduleName": f"{name}.{name}_dataset_builder",
        "name": name,
        "releaseNotes": {"1.0.0": "Initial release."},
        "splits": [
            {
                "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
                "name": split,
                "numBytes": str(sum(p.stat().st_size for p in fixture.shards)),
                "shardLengths": [str(len(p)) for p in per_shard],
            }
        ],
        "version": "1.0.0",
    }
    (root / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return fixture
