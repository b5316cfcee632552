"""What each feature of ``info.json`` becomes: its kind, its TED key and, for a camera, its
axis order (docs/formats.md, "LeRobot", "Keys")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.keys import clean_keys, renamed_note, text_note
from rlds_cli.formats.untrusted import require_shape

#: Columns the reader consumes itself (not stored as keys).
CONSUMED = ("next.done", "episode_index", "index")
#: TED keys the reader writes itself: reserved in the key cleaner.
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")


@dataclass
class Feature:
    """One feature of ``info.json`` and where it goes."""

    name: str
    kind: str  # "observation", "video", "image", "action", "reward", "info", "consumed"
    shape: tuple[int, ...]
    key: str = ""
    channels_first: bool = False


def channels_first(name: str, shape: tuple[int, ...], names: object, where: Path) -> bool:
    """Whether a camera feature (video or image) is declared CHW (else HWC), from its ``names``
    or its shape."""
    if len(shape) != 3:
        raise SourceFormatError(f"{where}: camera feature {name!r} has shape {list(shape)}, not 3 dimensions")
    if isinstance(names, list) and len(names) == 3:
        axes = [str(n).lower() for n in names]
        if axes[0] in ("channel", "channels", "c"):
            return True
        if axes[-1] in ("channel", "channels", "c"):
            return False
    # no usable names: the axis of 1, 3 or 4 is the channel axis (HWC when both could be)
    return shape[-1] not in (1, 3, 4) and shape[0] in (1, 3, 4)


@dataclass
class FeaturePlan:
    """The features of a dataset, planned: every kept feature with its key, the cameras, the
    parquet columns read, the axis names (kept for an export back to LeRobot) and whether the
    dataset has ``next.success``."""

    features: list[Feature]
    axis_names: dict[str, list[str]]
    success: bool

    @property
    def videos(self) -> list[Feature]:
        """The camera features (read from the mp4 files)."""
        return [f for f in self.features if f.kind == "video"]

    @property
    def columns(self) -> list[Feature]:
        """The features read from the parquet rows."""
        return [f for f in self.features if f.kind != "video"]


def plan_features(info: dict[str, Any], info_path: Path, report: ConversionReport) -> FeaturePlan:
    """Plan the ``features`` of ``info.json`` (notes about dropped or renamed names go to
    ``report``)."""
    features = info.get("features")
    if not isinstance(features, dict) or not features:
        raise SourceFormatError(f"{info_path}: no 'features' object")
    out: list[Feature] = []
    dropped: list[str] = []
    names_by_feature: dict[str, list[str]] = {}
    for name, spec in features.items():
        if not isinstance(spec, dict):
            raise SourceFormatError(f"{info_path}: feature {name!r} is not an object")
        dtype = spec.get("dtype")
        shape = require_shape(info_path, name, spec.get("shape"))
        axis_names = spec.get("names")
        if (
            isinstance(axis_names, list)
            and len(axis_names) <= 4096
            and all(isinstance(n, str) for n in axis_names)
        ):
            names_by_feature[name] = axis_names  # kept for an export back to LeRobot
        if dtype in ("video", "image"):  # a camera: mp4 files, or one image file a row in the parquet
            feat = Feature(name, dtype, shape)
            feat.channels_first = channels_first(name, shape, spec.get("names"), info_path)
        elif dtype == "string":
            dropped.append(name)
            continue
        elif name in CONSUMED:
            feat = Feature(name, "consumed", shape)
        elif name == "next.reward":
            feat = Feature(name, "reward", shape)
        elif name == "action" or name.startswith("action."):
            feat = Feature(name, "action", shape)
        elif name == "observation" or name.startswith("observation."):
            feat = Feature(name, "observation", shape)
        else:
            feat = Feature(name, "info", shape)
        out.append(feat)
    if not any(f.kind == "action" for f in out):
        raise SourceFormatError(f"{info_path}: no 'action' feature; rlds needs the actions")
    if not any(f.kind in ("observation", "video", "image") for f in out):
        raise SourceFormatError(f"{info_path}: no 'observation.*' feature")
    for name in dropped:
        report.notes.append(text_note(name, np.dtype(str)))
    wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
    for f in out:
        if f.kind in ("observation", "video", "image"):
            rest = (
                f.name.removeprefix("observation").removeprefix(".")
                if f.name.startswith("observation")
                else f.name
            )
            wanted[f.name] = ("observation", *(rest.split(".") if rest else []))
        elif f.kind == "action":
            wanted[f.name] = ("action", *f.name.split(".")[1:])
        elif f.kind == "info":
            wanted[f.name] = ("info", f.name)
    cleaned = clean_keys(wanted)
    source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
    renamed = renamed_note({k: cleaned[k] for k in source}, source)
    if renamed:
        report.notes.append(renamed)
    for f in out:
        f.key = cleaned.get(f.name, "next/reward" if f.kind == "reward" else "")
    return FeaturePlan(out, names_by_feature, "next.success" in features)
