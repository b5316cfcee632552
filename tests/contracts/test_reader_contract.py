"""Every reader of the package against the shared contract (:mod:`rlds_cli.testing.contracts`), each
on a small source written by the format's own fixture writers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from rlds_cli.formats.amago import AmagoReader
from rlds_cli.formats.atari_dqn.reader import AtariDQNReader
from rlds_cli.formats.d4rl import D4RLReader
from rlds_cli.formats.gen_dgrl import GenDGRLReader
from rlds_cli.formats.lerobot.reader import LeRobotReader
from rlds_cli.formats.minari.reader import MinariReader
from rlds_cli.formats.ogbench import OGBenchReader
from rlds_cli.formats.rlds_tfrecord.reader import RldsTFRecordReader
from rlds_cli.formats.robomimic import RobomimicReader
from rlds_cli.formats.roboset import RobosetReader
from rlds_cli.formats.torchrl_memmap import TorchRLMemmapReader
from rlds_cli.formats.vd4rl import VD4RLReader
from rlds_cli.testing.contracts import ReaderContract
from tests.atari_dqn_fixtures import run_folder, write_run
from tests.d4rl_fixtures import golden_three_episodes
from tests.fixtures.robomimic.make_fixtures import write_robomimic_image
from tests.formats_fixtures import golden_ogbench as golden_ogbench_file
from tests.formats_fixtures import golden_roboset, minari_episode, write_amago, write_minari_by_hand
from tests.gen_dgrl_fixtures import gen_dgrl_archive
from tests.rlds_tfrecord_fixtures import write_rlds_dataset
from tests.vd4rl_fixtures import dreamer_episode, write_dreamer_episodes

LEROBOT_FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "lerobot-v3-tiny"


class TestD4RLReader(ReaderContract):
    reader_cls = D4RLReader
    block_rows = 3

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return golden_three_episodes(tmp_path / "d.hdf5", with_next=True)


class TestD4RLReaderOnNpz(TestD4RLReader):
    """The D4RL layout in an ``.npz`` (what ``rlds export --to npz`` writes)."""

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        n = 6
        np.savez(
            tmp_path / "d.npz",
            observations=np.arange(2 * n, dtype=np.float32).reshape(n, 2),
            actions=np.zeros((n, 1), np.float32),
            rewards=np.ones(n, np.float32),
            terminals=np.array([0, 0, 1, 0, 0, 0], bool),
            timeouts=np.array([0, 0, 0, 0, 0, 1], bool),
        )
        return tmp_path / "d.npz"


class TestMinariReader(ReaderContract):
    reader_cls = MinariReader

    def write_source(self, tmp_path: Path) -> Path:
        return write_minari_by_hand(tmp_path / "m", [minari_episode(2), minari_episode(3, terminated=False)])


class TestRobosetReader(ReaderContract):
    reader_cls = RobosetReader

    def write_source(self, tmp_path: Path) -> Path:
        return golden_roboset(tmp_path / "r")

    def sniffed(self, source: Path) -> Path:
        return source / "a_trace.h5"


class TestRobomimicReader(ReaderContract):
    reader_cls = RobomimicReader
    block_rows = 3

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return write_robomimic_image(tmp_path / "image.hdf5")


class TestOGBenchReader(ReaderContract):
    reader_cls = OGBenchReader
    block_rows = 4

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return golden_ogbench_file(tmp_path / "o.npz")

    def write_other_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return golden_three_episodes(tmp_path / "d.hdf5", with_next=False)


class TestAmagoReader(ReaderContract):
    reader_cls = AmagoReader

    def write_source(self, tmp_path: Path) -> Path:
        return write_amago(tmp_path / "a", [(3, True), (4, False)])

    def sniffed(self, source: Path) -> Path:
        return next(source.rglob("*.npz"))


class TestTorchRLMemmapReader(ReaderContract):
    reader_cls = TorchRLMemmapReader
    block_rows = 3

    def write_source(self, tmp_path: Path) -> Path:
        from rlds_cli.cache import open_dataset
        from rlds_cli.export import export_dataset
        from rlds_cli.sources.convert import convert

        tmp_path.mkdir(parents=True)
        convert(golden_three_episodes(tmp_path / "d.hdf5", with_next=True), "for-torchrl")
        return export_dataset(open_dataset("for-torchrl"), tmp_path / "td", "torchrl")


class TestLeRobotReader(ReaderContract):
    reader_cls = LeRobotReader
    block_rows = 2

    def write_source(self, tmp_path: Path) -> Path:
        dst = tmp_path / "lerobot-v3-tiny"
        shutil.copytree(LEROBOT_FIXTURE, dst)
        return dst


class TestRldsTFRecordReader(ReaderContract):
    reader_cls = RldsTFRecordReader
    block_rows = 2

    def write_source(self, tmp_path: Path) -> Path:
        return write_rlds_dataset(tmp_path / "oxe", (3, 4), side=4).root


class TestVD4RLReader(ReaderContract):
    reader_cls = VD4RLReader
    block_rows = 3

    def write_source(self, tmp_path: Path) -> Path:
        episodes = [dreamer_episode(5, side=8, seed=0), dreamer_episode(4, side=8, seed=1, terminal=True)]
        write_dreamer_episodes(tmp_path / "e", episodes)
        return tmp_path / "e"


class TestAtariDQNReader(ReaderContract):
    reader_cls = AtariDQNReader
    block_rows = 8

    def write_source(self, tmp_path: Path) -> Path:
        write_run(run_folder(tmp_path), capacity=30, episode_lengths=[12, 9], obs_shape=(8, 8))
        return tmp_path


class TestGenDGRLReader(ReaderContract):
    reader_cls = GenDGRLReader

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return gen_dgrl_archive(tmp_path / "bigfish.tar.xz", episodes=2, steps=4, kinds="npz")[0]
