"""Regenerate the bundled demo file and print the numbers the registry entry needs.

Usage: python scripts/make_demo_dataset.py [OUTPUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rlds_cli._util.io import sha256_file
from rlds_cli.demo.pointmass import bundled_path, simulate, write_d4rl_file


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else bundled_path()
    rollouts = simulate()
    write_d4rl_file(out, rollouts)
    ends = rollouts.terminals | rollouts.timeouts
    print(f"wrote {out}")
    print(f"size = {out.stat().st_size}")
    print(f'sha256 = "{sha256_file(out)}"')
    print(
        f"rows = {len(rollouts.actions)}, terminals = {int(rollouts.terminals.sum())}, "
        f"timeouts = {int(rollouts.timeouts.sum())}, episodes = {int(ends.sum()) + int(not ends[-1])}"
    )
    print(f"reward mean = {float(np.mean(rollouts.rewards)):.4f}")


if __name__ == "__main__":
    main()
