"""Transforms given per source of a mixture: each runs on its own source's rows only.

``MixtureSource(..., transforms={"a": Normalize(keys=["action"]), "b": [Normalize(...), f]})``:

* a source's transforms run on its part of each batch after renaming (so their keys are the
  mixture's names) and before padding (so they see the source's own widths), with ``index``
  the row's step in that source and ``source`` its index;
* a transform with ``bind(dataset)`` is bound to its source's dataset when the mixture is made:
  a ``Normalize`` finds that dataset's statistics (a view's parent's, as for one dataset),
  reading each renamed key under the name the dataset stores it (``Normalize.bind``'s
  ``rename``). Other transforms that bind read the dataset by its stored names, so on a source
  that renames keys they are refused;
* a transform that binds is given to one source only (one object bound to two datasets would
  keep the last one's statistics): refused in one line naming both sources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import MixtureError
from rlds_cli.loader.protocols import Bindable
from rlds_cli.loader.transforms import Normalize

Transform = Callable[[TedBatch], TedBatch]
#: ``transforms=``: ``{source name: transform or list of transforms}``.
SourceTransforms = Mapping[str, Transform | Sequence[Transform]]


def bind_transforms(
    transforms: SourceTransforms | None,
    names: Sequence[str],
    datasets: Sequence[Dataset],
    renames: Sequence[Mapping[str, str]],
) -> list[list[Transform]]:
    """Per source (in ``names`` order), its chain of transforms, bound (module docstring)."""
    if transforms is None:
        return [[] for _ in names]
    if not isinstance(transforms, Mapping):
        raise MixtureError(
            f"transforms= maps source names to transforms ({{name: Normalize(...)}}), got "
            f"{type(transforms).__name__}; for one transform over whole batches use "
            "Loader(MixtureSource(...), transform=...)"
        )
    unknown = sorted(set(transforms) - set(names))
    if unknown:
        raise MixtureError(f"transforms name unknown source(s) {unknown}; sources are {list(names)}")
    owner: dict[int, str] = {}
    chains = []
    for name, ds, rename in zip(names, datasets, renames, strict=True):
        given = transforms.get(name)
        chain = [] if given is None else list(given) if isinstance(given, Sequence) else [given]
        for t in chain:
            if not callable(t):
                raise MixtureError(f"transforms[{name!r}] holds {t!r}, which is not callable")
            if isinstance(t, Bindable):
                if id(t) in owner:
                    raise MixtureError(
                        f"one {type(t).__name__} is given to sources {owner[id(t)]!r} and {name!r}: it "
                        "binds to one dataset; give each source its own"
                    )
                owner[id(t)] = name
                if isinstance(t, Normalize):
                    t.bind(ds, rename=rename)
                elif rename:
                    raise MixtureError(
                        f"transform {type(t).__name__} of source {name!r} reads dataset {ds.name!r} by "
                        "its stored key names, but the source renames keys: bind it yourself and pass "
                        "a plain function"
                    )
                else:
                    t.bind(ds)
        chains.append(chain)
    return chains


def normalized(chain: Sequence[Any]) -> list[tuple[Any, Mapping[str, str], Dataset | None]]:
    """The ``(statistics, stored key names, origin dataset)`` of each ``Normalize`` of a chain
    (what a normalization table holds for the source)."""
    out: list[tuple[Any, Mapping[str, str], Dataset | None]] = []
    for t in chain:
        if isinstance(t, Normalize) and t.statistics is not None:
            out.append((t.statistics, dict(t.stored_keys), t.origin))
    return out
