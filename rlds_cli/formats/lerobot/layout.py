"""A LeRobot dataset's files and features: where the files are, which may be read, and what each
feature of ``info.json`` becomes.

The dataset directory is found from the folder or its ``meta/info.json``; ``data_path`` and
``video_path`` templates are filled by a restricted formatter (known fields, integer widths only);
every file named or found must stay inside the dataset directory once symlinks are followed (or
in a Hugging Face hub snapshot's repository ``blobs/``). Each feature gets a kind, a TED key and,
for a camera, an axis order (docs/formats.md, "LeRobot", "Keys")."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.keys import clean_keys, renamed_note, text_note
from rlds_cli.formats.untrusted import UnsafeSourceError, read_json_file, require_shape

#: ``codebase_version`` values this reader understands.
VERSIONS = ("v2.1", "v3.0")
INFO_FILE = Path("meta") / "info.json"
#: Fields a path template may use, per version, and the integer width a spec may ask for.
_TEMPLATE_FIELDS = {
    "v3.0": {"chunk_index", "file_index", "video_key"},
    "v2.1": {"episode_chunk", "episode_index", "video_key"},
}
_SPEC = re.compile(r"(0?[0-9]{1,2})?d")
INCOMPLETE = "the dataset is incomplete: download the whole dataset folder again (meta/, data/ and videos/)"


def dataset_root(path: Path) -> Path | None:
    """The LeRobot dataset directory of ``path`` (the directory, or its ``meta/info.json``)."""
    if path.is_dir() and (path / INFO_FILE).is_file():
        return path
    if path.is_file() and path.name == "info.json" and path.parent.name == "meta":
        return path.parent.parent
    return None


def is_lerobot(path: Path) -> bool:
    """Whether ``path`` looks like a LeRobot dataset: a ``meta/info.json`` with a ``codebase_version``
    (or one that does not parse, so that this reader names the problem)."""
    root = dataset_root(path)
    if root is None:
        return False
    try:
        info = read_json_file(root / INFO_FILE)
    except SourceFormatError:
        return True
    return isinstance(info, dict) and "codebase_version" in info


def _allowed_roots(root: Path) -> list[Path]:
    """Where the dataset's files may really be: its directory, and for a Hugging Face hub snapshot
    (``.../datasets--org--name/snapshots/<revision>/``, symlinks into ``blobs/``) that ``blobs/`` folder."""
    roots = [root.resolve()]
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and blobs.is_dir():
        roots.append(blobs.resolve())
    return roots


def inside(root: Path, file: Path, where: object, what: str) -> Path:
    """``file`` if it stays inside ``root`` once symlinks are followed; refused otherwise
    (``where``: the metadata file that named it, ``None`` for a file found in the tree)."""
    try:
        real = file.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UnsafeSourceError(f"{where}: {what} {file} cannot be resolved: {exc}") from None
    if not any(real.is_relative_to(allowed) for allowed in _allowed_roots(root)):
        said = f"{where}: {what} {file}" if where is not None else str(file)
        raise UnsafeSourceError(
            f"{said} escapes the dataset directory {root} (to {real})",
            hint="rlds reads only files inside the dataset directory; the dataset is malicious or broken",
        )
    return file


def sniff(path: Path) -> bool:
    """Whether ``path`` is a LeRobot dataset (the folder or its ``meta/info.json``)."""
    return is_lerobot(path)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads and hashes: everything under ``meta/``, ``data/`` and
    ``videos/`` of the dataset, in sorted order (a file linking outside it is refused)."""
    out: list[Path] = []
    for p in paths:
        root = dataset_root(p)
        if root is None:
            out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            continue
        for sub in ("meta", "data", "videos"):
            if (root / sub).is_dir():
                files = sorted(q for q in (root / sub).rglob("*") if q.is_file())
                out += [inside(root, q, None, "file") for q in files]
    return out


def plan_files(names: Sequence[str]) -> list[str] | None:
    """Of a dataset folder's files, its metadata (``meta/``), which tells which data and video files
    hold each episode (``None`` for a listing without ``meta/info.json``)."""
    if INFO_FILE.as_posix() not in names:
        return None
    return [n for n in names if n.startswith("meta/")]


def fill_template(template: object, values: dict[str, Any], where: Path, what: str, version: str) -> str:
    """A path template filled like ``str.format``, but only with the known fields and integer widths
    (``str.format`` on an untrusted template could read attributes or ask for a gigabyte of padding)."""
    if not isinstance(template, str) or not template:
        raise SourceFormatError(f"{where}: {what} is {template!r}, not a path template")
    allowed = _TEMPLATE_FIELDS[version]
    out: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SourceFormatError(f"{where}: {what} {template!r} is not a valid template: {exc}") from None
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if name not in allowed or conversion or (spec and not _SPEC.fullmatch(spec)):
            raise SourceFormatError(
                f"{where}: {what} {template!r} uses the field "
                f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}; "
                f"LeRobot {version} templates use {sorted(allowed)} with integer widths only",
                hint="info.json is damaged or malicious: get the dataset from a trusted source",
            )
        value = values[name]
        if spec and not isinstance(value, int):
            raise SourceFormatError(f"{where}: {what} {template!r} gives the text field {name!r} a width")
        out.append(format(value, spec) if spec else str(value))
    return "".join(out)


def resolve_file(root: Path, rel: str, where: Path, what: str) -> Path:
    """The file a filled template names, refused when it leaves the dataset directory."""
    pure = Path(rel)
    if pure.is_absolute() or ".." in pure.parts or "\\" in rel or "\0" in rel:
        raise UnsafeSourceError(
            f"{where}: {what} {rel!r} escapes the dataset directory {root}",
            hint="rlds reads only files inside the dataset directory; the dataset is malicious or broken",
        )
    return inside(root, root / pure, where, what)


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
    """The dataset's features, planned: every kept feature with its key, the cameras, the parquet columns
    read, the axis names (for an export back to LeRobot), and whether ``next.success`` exists."""

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
