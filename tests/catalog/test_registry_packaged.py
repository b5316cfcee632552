"""The packaged registry itself: every entry well-formed, and the schema's checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlds_cli.cache.root import validate_name
from rlds_cli.catalog import registry
from rlds_cli.errors import RegistryFormatError
from rlds_cli.formats import known_formats

REPO = Path(__file__).resolve().parents[2]
NOTES = REPO.parent / "shared" / "reference" / "datasets.md"
FAMILIES = {
    "d4rl.toml": 183,
    "roboset.toml": 20,
    "minari.toml": 28,
    "ogbench.toml": 85,
    "vd4rl.toml": 20,
    "gen_dgrl.toml": 128,
    "atari_dqn.toml": 250,
    "demo.toml": 1,
}


@pytest.fixture(autouse=True)
def fresh_registry_cache() -> Iterator[None]:
    registry._load.cache_clear()
    yield
    registry._load.cache_clear()


def packaged() -> list[registry.RegistryEntry]:
    return registry.entries()


def test_families_and_counts() -> None:
    by_file = Counter(Path(e.origin).name for e in packaged())
    assert by_file == FAMILIES


def test_ids_and_aliases_unique_and_resolvable() -> None:
    keys = [k for e in packaged() for k in (e.id, *e.aliases)]
    assert len(keys) == len(set(keys))
    for e in packaged():
        for key in (e.id, *e.aliases):
            assert registry.resolve(key) is e
        assert validate_name(e.cache_name)


def test_every_entry_is_well_formed() -> None:
    formats = set(known_formats())
    for e in packaged():
        assert e.format in formats, e.id
        assert e.files or e.listing is not None, e.id
        assert e.description and e.license, e.id
        for f in e.files:
            assert f.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", f.sha256), e.id
            assert f.size is None or f.size > 0, e.id
            assert not Path(f.name).is_absolute() and ".." not in Path(f.name).parts, e.id
            for url in f.urls:
                if url.startswith(registry.BUNDLED_SCHEME):
                    continue
                parts = urllib.parse.urlsplit(url)
                assert parts.scheme in ("http", "https") and parts.netloc and parts.path, url
                assert not re.search(r"\s", url), url
        names = [f.name for f in e.files]
        assert len(names) == len(set(names)), e.id


def test_family_specific_shapes() -> None:
    for e in packaged():
        family = Path(e.origin).name
        if family == "d4rl.toml":
            (f,) = e.files
            assert f.name.endswith(".hdf5") and f.urls[0].startswith(
                "http://rail.eecs.berkeley.edu/datasets/"
            )
            assert isinstance(e.options["max_episode_steps"], int) and e.options["max_episode_steps"] > 0
            assert e.extra["ids"] == {"d4rl": e.id, "torchrl": e.id}
        elif family == "minari.toml":
            first, rest = e.id.split("/", 1)
            base = f"https://huggingface.co/datasets/farama-minari/{first}/resolve/main/{rest}/data/"
            assert [(f.name, f.urls) for f in e.files] == [
                ("data/metadata.json", (base + "metadata.json",)),
                ("data/main_data.hdf5", (base + "main_data.hdf5",)),
            ]
        elif family == "ogbench.toml":
            base = "https://rail.eecs.berkeley.edu/datasets/ogbench/"
            assert [f.urls for f in e.files] == [(f"{base}{e.id}.npz",), (f"{base}{e.id}-val.npz",)]
        elif family == "roboset.toml":
            assert e.files == () and e.listing is not None
            assert (e.listing.hf_repo, e.listing.path, e.listing.suffix) == (
                "jdvakil/RoboSet_Sim",
                e.id,
                ".h5",
            )
            assert e.cache_name.startswith("roboset/")


def test_known_cross_ecosystem_entries() -> None:
    assert registry.resolve("d4rl/hopper-medium-v2").options == {"max_episode_steps": 1000}
    assert registry.resolve("door-human-longhorizon-v1").files == registry.resolve("door-human-v1").files
    assert registry.resolve("door-human-longhorizon-v1").options == {"max_episode_steps": 300}
    assert registry.resolve("ogbench/antmaze-large-navigate-v0").format == "ogbench"
    assert registry.resolve("D4RL/door/human-v2").extra["first_party"] is True
    assert registry.resolve("D4RL/kitchen/mixed-v2").extra["first_party"] is False
    assert (
        registry.resolve("roboset/FK1-v4_human/human_demos_by_playdata").id
        == "FK1-v4(human)/human_demos_by_playdata"
    )


@pytest.mark.skipif(not NOTES.is_file(), reason="the reference notes are not next to this checkout")
def test_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gen_registry.py"),
            "--notes",
            str(NOTES),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    for name in sorted(p.name for p in tmp_path.glob("*.toml")):
        assert (tmp_path / name).read_text() == (REPO / "registry" / name).read_text(), name


@pytest.mark.parametrize(
    ("file_table", "message"),
    [
        ('name = "a"\nurls = ["https://x.org/a"]\nsha256 = "xyz"\n', "'sha256' ('xyz' is not 64 hex digits)"),
        (
            'name = "a"\nurls = ["ftp://x.org/a"]\n',
            "'urls' ('ftp://x.org/a' is neither http(s):// nor bundled:)",
        ),
        ('name = "a"\nurls = ["https://x.org/a b"]\n', "is neither http(s)://"),
        ('name = "../a"\nurls = ["https://x.org/a"]\n', "'name' ('../a' must be a relative path"),
        ('name = "/etc/a"\nurls = ["https://x.org/a"]\n', "'name' ('/etc/a' must be a relative path"),
        ('name = "a"\nurls = ["https://x.org/a"]\nsize = -1\n', "'size' (-1 is negative)"),
        # these crashed the download ('unexpected OSError', 'unexpected FileExistsError'), or let one
        # URL's bytes stand for two files
        ('name = "."\nurls = ["https://x.org/a"]\n', "'name' ('.' must be a relative path"),
        (
            'name = "./x"\nurls = ["https://x.org/a"]\n[[dataset.files]]\nname = "x"\nurls = ["https://x.org/b"]\n',
            "'name' ('x' names two files",
        ),
        (
            'name = "x"\nurls = ["https://x.org/a"]\n[[dataset.files]]\nname = "x"\nurls = ["https://x.org/b"]\n',
            "'name' ('x' names two files",
        ),
        (
            'name = "a"\nurls = ["https://x.org/a"]\n[[dataset.files]]\nname = "a/b"\nurls = ["https://x.org/b"]\n',
            "'name' ('a' is a file and the folder of another file)",
        ),
    ],
    ids=[
        "sha256",
        "scheme",
        "space",
        "dotdot",
        "absolute",
        "size",
        "dot",
        "same-as-dot-slash",
        "twice",
        "folder",
    ],
)
def test_bad_entry_gives_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_table: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'[[dataset]]\nid = "bad-v0"\nformat = "d4rl"\n[[dataset.files]]\n{file_table}')
    monkeypatch.setenv("RLDS_REGISTRY", str(path))
    with pytest.raises(RegistryFormatError) as info:
        registry.resolve("demo")
    assert str(info.value).startswith(f"registry file {path}: entry 'bad-v0' is missing or has a bad ")
    assert message in str(info.value)


def test_listing_needs_a_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[dataset]]\nid = "l-v0"\nformat = "roboset"\n[dataset.listing]\npath = "x"\n')
    monkeypatch.setenv("RLDS_REGISTRY", os.fspath(path))
    with pytest.raises(RegistryFormatError, match="'listing' \\(a table with hf_repo and path\\)"):
        registry.entries()
