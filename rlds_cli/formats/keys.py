"""Source names -> TED keys: the key cleaner every reader uses, and the text-column rule.

A TED key is ``/``-separated parts, each of ``A-Z a-z 0-9 _ . -``, neither ``.`` nor ``..``, at
most 200 characters a part and 32 parts (:func:`key_problem`; the storage backends refuse any
other key). Source names allow more (HDF5 ``infos/pos x``, any ``.npz`` member name, tensordict
keys). The rules (also in ``docs/formats.md``, "Key names"):

* Each part is cleaned on its own: a character outside ``A-Z a-z 0-9 _ . -`` becomes ``_``; an
  empty part becomes ``_``, a part ``.``/``..`` becomes ``_``/``__``.
* Names are cleaned per group (the parts under one parent). When several clean to the same part,
  an already-clean name keeps it; the others, by source name (code point order), get the first
  suffix ``_2``, ``_3``, ... unused in that group. So two source names never share a key and a
  leaf never shares a name with a group, whatever the source's order.
* Every key that differs from its source name is listed in the conversion notes.

Text and other object values (variable-length HDF5 strings, fixed-width bytes/unicode, object
arrays) are dropped with a conversion note (:func:`is_text`); raw object pointers are never stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

# The key grammar lives in the bottom layer (the cache checks keys without importing a format);
# re-exported for the readers.
from rlds_cli.cache.ted import MAX_KEY_PART_CHARS as MAX_KEY_PART_CHARS
from rlds_cli.cache.ted import MAX_KEY_PARTS as MAX_KEY_PARTS
from rlds_cli.cache.ted import is_valid_key as is_valid_key
from rlds_cli.cache.ted import key_problem as key_problem

_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.-]")


def clean_part(name: str) -> str:
    """One part of a source name made valid (not yet disambiguated from its siblings)."""
    cleaned = _BAD_CHAR.sub("_", name)
    if cleaned in ("", ".", ".."):
        # '.' and '..' would be directory links on disk; '' an empty path part
        return "_" * max(1, len(cleaned))
    return cleaned


def clean_keys(wanted: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Valid, distinct TED keys for the names of one source.

    Args:
        wanted: Per source name (any unique label, e.g. an HDF5 path), the parts of the key before
            cleaning (``("info", "pos x")``).

    Returns:
        Per source name, its TED key. Distinct names get distinct keys, no key is a group
        (``/``-prefix) of another, and the result does not depend on ``wanted``'s order.
    """
    out: dict[str, str] = {}
    items = [(label, tuple(parts)) for label, parts in wanted.items()]
    empty = [label for label, parts in items if not parts]
    if empty:
        raise ValueError(f"source name {empty[0]!r} maps to an empty key")
    _assign(items, (), out)
    return out


def _assign(items: list[tuple[str, tuple[str, ...]]], prefix: tuple[str, ...], out: dict[str, str]) -> None:
    """Name the entries of one group (its leaves and its subgroups), then recurse."""
    groups: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    # an entry: (raw name, kind 0 leaf / 1 group, label of a leaf or the raw name of a group)
    entries: list[tuple[str, int, str]] = []
    for label, parts in items:
        if len(parts) == 1:
            entries.append((parts[0], 0, label))
        else:
            if parts[0] not in groups:
                entries.append((parts[0], 1, parts[0]))
            groups.setdefault(parts[0], []).append((label, parts[1:]))
    # already-clean names first, so a clean name is never taken by another's suffix
    entries.sort(key=lambda e: (clean_part(e[0]) != e[0], e[0], e[1], e[2]))
    names: dict[tuple[str, int, str], str] = {}
    taken: set[str] = set()
    for entry in entries:
        cleaned = clean_part(entry[0])
        if cleaned not in taken:
            taken.add(cleaned)
            names[entry] = cleaned
    for entry in entries:
        if entry in names:
            continue
        cleaned, k = clean_part(entry[0]), 2
        while f"{cleaned}_{k}" in taken:
            k += 1
        names[entry] = f"{cleaned}_{k}"
        taken.add(names[entry])
    for entry in entries:
        raw, kind, label = entry
        if kind == 0:
            out[label] = "/".join((*prefix, names[entry]))
        else:
            _assign(groups[raw], (*prefix, names[entry]), out)


def renamed_note(keys: Mapping[str, str], wanted: Mapping[str, Sequence[str]]) -> str | None:
    """A conversion note listing the keys that differ from their source names (``None``: none).
    ``keys`` is :func:`clean_keys`'s result for ``wanted``.
    """
    changed = sorted((label, key) for label, key in keys.items() if key != "/".join(wanted[label]))
    if not changed:
        return None
    shown = ", ".join(f"{label!r} -> {key!r}" for label, key in changed)
    return (
        f"source names cleaned into TED keys (only A-Z a-z 0-9 _ . - per part; clashes get _2, _3...): "
        f"{shown}"
    )


def is_text(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` are text or Python objects (variable-length HDF5 strings, ``object``
    arrays, fixed-width ``bytes``/``str``): not storable in the cache."""
    return np.dtype(dtype).kind in "OSU"


def text_note(key: str, dtype: np.dtype) -> str:
    """The conversion note for a dropped text/object column."""
    dtype = np.dtype(dtype)
    if dtype.kind != "O":
        what = "text values"
    elif dtype.metadata and dtype.metadata.get("vlen") in (str, bytes):  # how h5py marks its string dtypes
        what = "variable-length strings"
    else:
        what = "variable-length (object) values"
    return f"{key}: {what} are not stored (the cache holds numeric arrays only); column dropped"
