"""Real Atari frames for the pixel benchmarks, generated with ale-py and cached.

Frames that no one here designed: a random policy plays a few Atari games (the ROMs ship in the
ale-py wheel, >= 0.9) with the preprocessing of the Atari DQN replay data:

* sticky actions (``repeat_action_probability`` 0.25, ALE's own, applied per emulator frame);
* frame skip 4: the action is repeated for 4 emulator frames, rewards summed, and the observation
  is the pixel-wise max of the last two screens (Atari sprites flicker between frames);
* grayscale (ALE's luminance screen) resized to 84x84 by area averaging (PIL's ``BOX`` filter:
  each output pixel is the mean of the source pixels it covers, what cv2's ``INTER_AREA`` does);
* the RGB variant: the max-pooled RGB screen resized the same way to 84x84x3 (channels last, as
  a camera image), so gray and RGB differ only by colour;
* episodes end at the game's own end (``terminated``) or are cut (``truncated``) at
  :data:`MAX_EPISODE_STEPS` steps (DQN's 108,000 frames) or where a game's share of the steps ends.

Games (:data:`GAMES`) take equal shares of the steps, so frames vary. The output is a D4RL-layout
HDF5 file (``observations``, ``next_observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts``; ``observations[t+1] == next_observations[t]`` inside an episode), which
``rlds convert --format d4rl`` turns into a dataset (memmap or zarr) and the peers' fills read
(``pixel_bench.torchrl_fill``). Files are cached under ``benchmarks/_work/real_frames``
(git-ignored), named by every parameter and :data:`FORMAT`, and written atomically.

Usage::

    python benchmarks/real_frames.py gray|rgb [--steps N] [--quick] [--seed 0]   # prints the path
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / "_work" / "real_frames"
#: Bumped whenever the generated content changes, so old cache files are not reused.
FORMAT = 1
GAMES = ("pong", "breakout", "space_invaders", "seaquest")
FRAME_SKIP = 4
STICKY = 0.25
SIZE = 84
#: DQN's episode cap: 108,000 emulator frames = 27,000 steps of 4 frames.
MAX_EPISODE_STEPS = 27_000
#: (full, quick) steps per mode: the issue's 100k gray and 30k RGB frames.
STEPS = {"gray": (100_000, 10_000), "rgb": (30_000, 3_000)}


def preprocess(last_two: np.ndarray, size: int = SIZE) -> np.ndarray:
    """DQN preprocessing of the last two screens of a skip, ``(2, H, W)`` gray or ``(2, H, W, 3)``
    RGB uint8: their pixel-wise max, resized to ``size x size`` by area averaging (uint8)."""
    from PIL import Image

    pooled = np.maximum(last_two[0], last_two[1])
    image = Image.fromarray(pooled)  # 2-D uint8: "L"; (H, W, 3) uint8: "RGB"
    return np.asarray(image.resize((size, size), Image.Resampling.BOX), dtype=np.uint8)


class Game:
    """One ALE game with sticky actions, stepped ``FRAME_SKIP`` frames at a time."""

    def __init__(self, name: str, mode: str, seed: int) -> None:
        from ale_py import ALEInterface, roms

        self.ale = ALEInterface()
        self.ale.setInt("random_seed", seed)
        self.ale.setFloat("repeat_action_probability", STICKY)
        self.ale.setInt("frame_skip", 1)  # the skip and max are done here, as DQN's wrapper does
        self.ale.setLoggerMode(_logger_error())
        rom = roms.get_rom_path(name)
        if rom is None:
            raise SystemExit(f"real_frames: ale-py has no ROM named {name!r}; pick one of {GAMES}")
        self.ale.loadROM(rom)
        self.actions = list(self.ale.getMinimalActionSet())
        h, w = self.ale.getScreenDims()
        self.rgb = mode == "rgb"
        self.screens = np.zeros((2, h, w, 3) if self.rgb else (2, h, w), np.uint8)

    def _grab(self, slot: int) -> None:
        if self.rgb:
            self.ale.getScreenRGB(self.screens[slot])
        else:
            self.ale.getScreenGrayscale(self.screens[slot])

    def reset(self) -> np.ndarray:
        """A new episode's first observation."""
        self.ale.reset_game()
        self._grab(0)
        self.screens[1] = self.screens[0]
        return preprocess(self.screens)

    def step(self, action_index: int) -> tuple[np.ndarray, float, bool]:
        """``(observation, summed reward, terminated)`` after repeating the action for the skip."""
        reward = 0.0
        action = self.actions[action_index]
        for k in range(FRAME_SKIP):
            reward += self.ale.act(action)
            if k >= FRAME_SKIP - 2:
                self._grab(k - (FRAME_SKIP - 2))
            if self.ale.game_over():
                if k < FRAME_SKIP - 2:  # ended before the pooled frames: pool the last screen
                    self._grab(0)
                    self.screens[1] = self.screens[0]
                elif k == FRAME_SKIP - 2:
                    self.screens[1] = self.screens[0]
                return preprocess(self.screens), reward, True
        return preprocess(self.screens), reward, False


def _logger_error() -> Any:
    from ale_py import LoggerMode

    return LoggerMode.Error


def cache_path(mode: str, steps: int, seed: int, games: tuple[str, ...] = GAMES) -> Path:
    """Where the file for these parameters is cached."""
    return (
        CACHE
        / f"atari-{mode}-{'+'.join(games)}-{steps}-skip{FRAME_SKIP}-sticky{STICKY}-seed{seed}-v{FORMAT}.hdf5"
    )


def generate(
    path: Path, mode: str, steps: int, seed: int = 0, games: tuple[str, ...] = GAMES
) -> dict[str, Any]:
    """Write ``steps`` steps of random-policy play (equal shares per game) to ``path`` (D4RL
    layout, written to a ``.partial`` file then renamed). Returns counts for the log."""
    import data as bench_data  # benchmarks/data.py: the D4RL file layout

    if mode not in STEPS:
        raise SystemExit(f"real_frames: mode must be one of {sorted(STEPS)}, not {mode!r}")
    shape = (SIZE, SIZE, 3) if mode == "rgb" else (SIZE, SIZE)
    rng = np.random.default_rng(seed)
    counts = {"episodes": 0, "terminated": 0, "truncated": 0}
    with bench_data.d4rl_file(path, steps, (*shape, np.uint8), (np.int64,)) as f:
        obs, nxt = f["observations"], f["next_observations"]
        actions = np.zeros(steps, np.int64)
        rewards = np.zeros(steps, np.float32)
        terminals = np.zeros(steps, bool)
        timeouts = np.zeros(steps, bool)
        row = 0
        for g, name in enumerate(games):
            end = steps * (g + 1) // len(games)
            game = Game(name, mode, seed + g)
            while row < end:
                frames = [game.reset()]
                start = row
                while True:
                    a = int(rng.integers(len(game.actions)))
                    frame, reward, done = game.step(a)
                    frames.append(frame)
                    actions[row], rewards[row], terminals[row] = a, reward, done
                    row += 1
                    if done:
                        break
                    if row == end or row - start == MAX_EPISODE_STEPS:
                        timeouts[row - 1] = True
                        break
                block = np.stack(frames)
                obs[start:row], nxt[start:row] = block[:-1], block[1:]
                counts["episodes"] += 1
                counts["terminated" if terminals[row - 1] else "truncated"] += 1
        for key, values in zip(
            ("actions", "rewards", "terminals", "timeouts"),
            (actions, rewards, terminals, timeouts),
            strict=True,
        ):
            f[key][:] = values
        f.attrs["games"] = ",".join(games)
        f.attrs["preprocessing"] = f"sticky {STICKY}, skip {FRAME_SKIP}, max of last 2, {mode} {shape} BOX"
    return counts


def ensure(mode: str, steps: int, seed: int = 0, log: Any = None) -> Path:
    """The cached file for these parameters, generated first when absent."""
    path = cache_path(mode, steps, seed)
    if not path.exists():
        import time

        t = time.perf_counter()
        counts = generate(path, mode, steps, seed)
        if log is not None:
            log(
                f"generated {path.name}: {steps:,} {mode} frames, {counts['episodes']} episodes "
                f"({counts['terminated']} terminated, {counts['truncated']} truncated), "
                f"{time.perf_counter() - t:.0f} s"
            )
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=sorted(STEPS))
    p.add_argument("--steps", type=int, help="steps (default: 100,000 gray, 30,000 rgb)")
    p.add_argument("--quick", action="store_true", help="a tenth of the default steps")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    steps = args.steps or STEPS[args.mode][1 if args.quick else 0]
    print(ensure(args.mode, steps, args.seed, log=lambda m: print(m, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
