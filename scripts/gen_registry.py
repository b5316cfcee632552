"""Generate the registry's family files (registry/<family>.toml), one generator for every family.

Usage::

    python scripts/gen_registry.py [--family NAME ...] [--notes datasets.md] [--out registry]
                                   [--checkpoints 0:51]

Each family's facts come from one source module beside this script, which says where every id
and URL comes from (no id, URL or checksum is typed by hand or invented):

* ``registry_notes.py``: D4RL, RoboSet, Minari, OGBench and V-D4RL, from the reference notes on
  datasets (``../shared/reference/datasets.md``; published sizes from ``user-needs.md``);
* ``registry_atari_dqn.py``: the DQN Replay Dataset, from TorchRL's list and Dopamine's names;
* ``registry_gen_dgrl.py``: Gen-DGRL (Procgen), from TorchRL's ``GenDGRLExperienceReplay``.

No source publishes checksums or exact sizes: rlds records the sha256 and size of the first
download in <root>/raw/<entry>/.rlds/hashes.json and verifies every later copy against them. The
generated TOML is committed; re-run this script when a source changes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a file: the family modules beside it
import registry_atari_dqn
import registry_gen_dgrl
import registry_notes

NOTES_FAMILIES = ("d4rl", "roboset", "minari", "ogbench", "vd4rl")
FAMILIES = (*NOTES_FAMILIES, "atari_dqn", "gen_dgrl")


def render(families: list[str], args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    """File stem -> (TOML text, entries) for each family asked for."""
    out: dict[str, tuple[str, int]] = {}
    if set(families) & set(NOTES_FAMILIES):
        notes = registry_notes.render(args.notes, args.sizes)
        out.update({f: notes[f] for f in families if f in notes})
    makers: dict[str, Callable[[], tuple[str, int]]] = {
        "atari_dqn": lambda: registry_atari_dqn.render(args.checkpoints),
        "gen_dgrl": registry_gen_dgrl.render,
    }
    out.update({f: makers[f]() for f in families if f in makers})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=FAMILIES, help="(repeatable; default: all)")
    parser.add_argument("--notes", type=Path, default=registry_notes.DEFAULT_NOTES)
    parser.add_argument(
        "--sizes", type=Path, default=None, help="notes quoting published sizes (default: user-needs.md)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "registry")
    parser.add_argument(
        "--checkpoints",
        type=registry_atari_dqn.parse_range,
        default=registry_atari_dqn.CHECKPOINTS,
        help="atari_dqn: checkpoints A:B of every run (default 0:51)",
    )
    args = parser.parse_args()
    for family, (text, count) in render(args.family or list(FAMILIES), args).items():
        (args.out / f"{family}.toml").write_text(text, encoding="utf-8")
        print(f"{family}: {count} entries")


if __name__ == "__main__":
    main()
