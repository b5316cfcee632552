"""The column plan: ``features.json``'s leaves mapped to TED keys, roles and row shapes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.keys import clean_keys
from rlds_cli.formats.tfds_features import IMAGE, TEXT, Features, Leaf

#: Largest per-episode value kept as a source array (values per episode).
MAX_EPISODE_VALUES = 4096
_FLAGS = ("is_first", "is_last", "is_terminal")
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")


@dataclass(frozen=True)
class _Column:
    """One feature and where it goes.

    ``role``: ``"obs"`` (flat), ``"step"`` (per step), ``"reward"``, ``"flag"`` (consumed) or
    ``"episode"`` (a per-episode source array).
    """

    leaf: Leaf
    role: str
    key: str
    row_shape: tuple[int, ...]

    @property
    def text(self) -> bool:
        return self.leaf.kind == TEXT


@dataclass(frozen=True)
class _Plan:
    """What workers need to decode pieces (pickled with every task)."""

    columns: tuple[_Column, ...]


def _plan_columns(features: Features, where: Path) -> tuple[list[_Column], dict[str, tuple[str, ...]]]:
    """Each leaf's role and TED key (through the key cleaner), and the key parts before cleaning."""
    wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
    roles: dict[str, str] = {}
    for leaf in features.steps:
        rel = leaf.path[1:]
        if rel in (("observation",), ("action",)) and leaf.kind == TEXT:
            raise SourceFormatError(f"{where}: steps/{rel[0]} is text; rlds needs numeric {rel[0]}s")
        if len(rel) == 1 and rel[0] in _FLAGS and leaf.kind == "tensor" and len(leaf.shape) <= 1:
            roles[leaf.name] = "flag"
            continue
        if rel == ("reward",) and leaf.kind == "tensor":
            roles[leaf.name] = "reward"
            continue
        if rel and rel[0] == "observation":
            parts: tuple[str, ...] = ("observation", *rel[1:])
            roles[leaf.name] = "obs"
        elif rel and rel[0] == "action":
            parts = ("action", *rel[1:])
            roles[leaf.name] = "step"
        else:
            parts = ("info", *rel)
            roles[leaf.name] = "step"
        if leaf.kind == TEXT:
            parts = (*parts[:-1], parts[-1] + "_index")
        wanted[leaf.name] = parts
    names = [leaf.name for leaf in features.steps]
    if not any(n == "steps/action" or n.startswith("steps/action/") for n in names):
        raise SourceFormatError(f"{where} declares no steps/action; rlds needs the actions")
    if not any(roles.get(n) == "obs" for n in names):
        raise SourceFormatError(f"{where} declares no readable steps/observation")
    cleaned = clean_keys(wanted)
    columns: list[_Column] = []
    for leaf in features.steps:
        role = roles[leaf.name]
        if role == "flag":
            columns.append(_Column(leaf, role, leaf.path[-1], ()))
            continue
        key = "next/reward" if role == "reward" else cleaned[leaf.name]
        if leaf.kind == TEXT:
            shape: tuple[int, ...] = () if role == "obs" else (1,)
        elif role in ("reward", "step") and leaf.shape == () and not key.startswith("action"):
            shape = (1,)  # TED's trailing axis for scalar rewards and infos
        else:
            shape = leaf.shape
        columns.append(_Column(leaf, role, key, shape))
    source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
    return columns, source


def _episode_columns(features: Features, report: ConversionReport) -> list[_Column]:
    """Per-episode leaves as source arrays ``rlds/episode_<name>``."""
    wanted: dict[str, tuple[str, ...]] = {}
    kept: list[Leaf] = []
    for leaf in features.episode:
        rel = leaf.path[1:] if leaf.path[0] == "episode_metadata" and len(leaf.path) > 1 else leaf.path
        if leaf.kind == IMAGE:
            report.notes.append(f"{leaf.name}: per-episode images are not stored")
            continue
        if leaf.kind != TEXT and (any(d < 0 for d in leaf.shape) or leaf.known_values > MAX_EPISODE_VALUES):
            report.notes.append(
                f"{leaf.name}: per-episode values of shape {list(leaf.shape)} are not stored "
                f"(at most {MAX_EPISODE_VALUES} values of known shape)"
            )
            continue
        wanted[leaf.name] = ("episode_" + ".".join(rel),)
        kept.append(leaf)
    cleaned = clean_keys(wanted) if wanted else {}
    return [_Column(leaf, "episode", "rlds/" + cleaned[leaf.name], leaf.shape) for leaf in kept]
