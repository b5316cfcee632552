"""The dataset registry: packaged TOML, ``$RLDS_REGISTRY`` extras, and download through it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog import registry
from rlds_cli.cli.app import app
from rlds_cli.errors import (
    ChecksumMismatchError,
    OfflineError,
    RegistryError,
    RegistryFormatError,
    UnknownDatasetIdError,
)
from rlds_cli.sources.download import download

DEMO_ID = "pointmass-demo-v0"
DEMO_SHA256 = "524b86aee0d4b6d936da86b82cfe17ed10bba65bad78f0f9a6b941e9a89ead8e"
DEMO_SIZE = 345375

EXTRA_TOML = """
[[dataset]]
id = "extra-medium-v0"
aliases = ["extra", "org/extra-medium-v0"]
format = "d4rl"
description = "an extra entry"
license = "CC-BY-4.0"
max_episode_steps = 7
env = "Extra-v0"

[[dataset.files]]
name = "extra-medium-v0.hdf5"
urls = ["https://example.org/extra-medium-v0.hdf5", "https://mirror.example.org/extra.hdf5"]
size = 1234
sha256 = "ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789"
"""


def entry_toml(dataset_id: str, *, aliases: str = "[]", extra: str = "", files: str | None = None) -> str:
    files = (
        files
        if files is not None
        else f'[[dataset.files]]\nname = "{dataset_id}.hdf5"\nurls = ["https://example.org/{dataset_id}.hdf5"]\n'
    )
    return f'[[dataset]]\nid = "{dataset_id}"\naliases = {aliases}\nformat = "d4rl"\n{extra}\n{files}'


@pytest.fixture(autouse=True)
def fresh_registry_cache() -> Iterator[None]:
    """``registry._load`` is cached per tuple of paths; tests rewrite files, so start clean."""
    registry._load.cache_clear()
    yield
    registry._load.cache_clear()


def use_registry(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    monkeypatch.setenv("RLDS_REGISTRY", os.pathsep.join(str(p) for p in paths))


# --------------------------------------------------------------------------- packaged registry


def test_packaged_registry_loads() -> None:
    ids = [e.id for e in registry.entries()]
    assert DEMO_ID in ids
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids))
    assert (registry.packaged_registry_dir() / "demo.toml").is_file()


def test_demo_entry_and_aliases() -> None:
    entry = registry.resolve(DEMO_ID)
    assert registry.resolve("demo") is entry
    assert registry.resolve("rlds/pointmass-demo-v0") is entry
    assert entry.aliases == ("demo", "rlds/pointmass-demo-v0")
    assert entry.format == "d4rl"
    assert entry.license == "Apache-2.0"
    assert entry.options == {"max_episode_steps": 100}
    assert entry.extra == {"env": "PointMass2D-v0", "source_rows": 5000, "num_episodes": 94}
    assert entry.origin == str(registry.packaged_registry_dir() / "demo.toml")
    (file,) = entry.files
    assert file.name == "pointmass-demo-v0.hdf5"
    assert file.urls == ("bundled:pointmass-demo-v0.hdf5",)
    assert file.is_bundled
    assert (file.size, file.sha256) == (DEMO_SIZE, DEMO_SHA256)
    for key in (DEMO_ID, "demo", "rlds/pointmass-demo-v0"):
        assert registry.is_known(key)
    assert not registry.is_known("Demo")
    # aliases do not make extra entries
    assert [e.id for e in registry.entries()].count(DEMO_ID) == 1


def test_bundled_file_matches_its_entry() -> None:
    file = registry.resolve("demo").files[0]
    path = file.bundled_path()
    assert path.is_file()
    assert path.name == "pointmass-demo-v0.hdf5"
    assert path.stat().st_size == file.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == file.sha256


def test_unknown_id() -> None:
    with pytest.raises(UnknownDatasetIdError) as info:
        registry.resolve("no-such-id")
    assert str(info.value) == "unknown dataset id 'no-such-id'"  # not re-quoted like KeyError
    assert "rlds list --remote" in info.value.hint
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, RegistryError)
    assert not registry.is_known("no-such-id")


# --------------------------------------------------------------------------- RLDS_REGISTRY


def test_extra_registry_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text(EXTRA_TOML)
    assert not registry.is_known("extra")
    use_registry(monkeypatch, extra)
    entry = registry.resolve("extra")
    assert registry.resolve("extra-medium-v0") is entry
    assert registry.resolve("org/extra-medium-v0") is entry
    assert entry.id == "extra-medium-v0"
    assert entry.origin == str(extra)
    assert entry.options == {"max_episode_steps": 7}
    assert entry.extra == {"env": "Extra-v0"}
    assert entry.description == "an extra entry"
    (file,) = entry.files
    assert file.urls == ("https://example.org/extra-medium-v0.hdf5", "https://mirror.example.org/extra.hdf5")
    assert not file.is_bundled
    assert file.size == 1234
    assert file.sha256 == "abcdef0123456789" * 4  # stored lower-case
    assert [e.id for e in registry.entries() if e.origin == str(extra)] == ["extra-medium-v0"]
    assert DEMO_ID in {e.id for e in registry.entries()}
    assert registry.resolve("demo").id == DEMO_ID  # the packaged ones stay


def test_extra_registry_folder_and_several_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "reg.d"
    folder.mkdir()
    (folder / "b.toml").write_text(entry_toml("bravo-v0"))
    (folder / "a.toml").write_text(entry_toml("alpha-v0", aliases='["alpha"]'))
    (folder / "notes.md").write_text("not [ a registry")  # only *.toml is read
    single = tmp_path / "c.toml"
    single.write_text(entry_toml("charlie-v0"))
    use_registry(monkeypatch, folder, single)
    mine = [
        e.id for e in registry.entries() if not e.origin.startswith(str(registry.packaged_registry_dir()))
    ]
    assert mine == ["alpha-v0", "bravo-v0", "charlie-v0"]
    assert registry.resolve("alpha").origin == str(folder / "a.toml")
    assert registry.resolve("charlie-v0").origin == str(single)


def test_duplicate_id_across_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "one.toml", tmp_path / "two.toml"
    first.write_text(entry_toml("dup-v0"))
    second.write_text(entry_toml("dup-v0"))
    use_registry(monkeypatch, first, second)
    with pytest.raises(RegistryFormatError) as info:
        registry.resolve("dup-v0")
    assert str(second) in str(info.value)
    assert str(first) in str(info.value)
    assert "'dup-v0'" in str(info.value)


def test_alias_clashing_with_packaged_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clash = tmp_path / "clash.toml"
    clash.write_text(entry_toml("mine-v0", aliases='["demo"]'))
    use_registry(monkeypatch, clash)
    with pytest.raises(RegistryFormatError, match="'demo' is already defined in") as info:
        registry.entries()
    assert str(clash) in str(info.value)


def test_duplicate_inside_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "self.toml"
    path.write_text(entry_toml("self-v0", aliases='["self-v0"]'))
    use_registry(monkeypatch, path)
    with pytest.raises(RegistryFormatError, match="'self-v0'"):
        registry.entries()


def test_malformed_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[dataset]\nid = "x"\n')
    use_registry(monkeypatch, bad)
    with pytest.raises(RegistryFormatError) as info:
        registry.resolve("demo")
    assert str(info.value).startswith(f"cannot read registry file {bad}: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ('[[dataset]]\nid = "nofmt-v0"\n[[dataset.files]]\nname = "a"\nurls = ["https://x/a"]\n', "'format'"),
        ('[[dataset]]\nid = "nofiles-v0"\nformat = "d4rl"\n', "'files'"),
        ('[[dataset]]\nformat = "d4rl"\n[[dataset.files]]\nname = "a"\nurls = ["https://x/a"]\n', "'id'"),
        ('[[dataset]]\nid = "nourls-v0"\nformat = "d4rl"\n[[dataset.files]]\nname = "a"\n', "'urls'"),
        (
            '[[dataset]]\nid = "nourls-v0"\nformat = "d4rl"\n[[dataset.files]]\nurls = ["https://x/a"]\n',
            "'name'",
        ),
        ('[[dataset]]\nid = "empty-v0"\nformat = "d4rl"\nfiles = []\n', "'files'"),
        ('[[dataset]]\nid = "e-v0"\nformat = "d4rl"\n[[dataset.files]]\nname = "a"\nurls = []\n', "'urls'"),
        (
            '[[dataset]]\nid = "s-v0"\nformat = "d4rl"\n[[dataset.files]]\nname = "a"\nurls = "https://x/a"\n',
            "'urls'",
        ),
        (entry_toml("al-v0", aliases='"single"'), "'aliases'"),
        (
            entry_toml("sz-v0", files='[[dataset.files]]\nname = "a"\nurls = ["https://x"]\nsize = "big"\n'),
            "",
        ),
    ],
    ids=[
        "no-format",
        "no-files",
        "no-id",
        "no-urls",
        "no-name",
        "empty-files",
        "empty-urls",
        "urls-str",
        "aliases-str",
        "bad-size",
    ],
)
def test_entry_missing_or_bad_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, missing: str
) -> None:
    path = tmp_path / "partial.toml"
    path.write_text(text)
    use_registry(monkeypatch, path)
    with pytest.raises(RegistryFormatError) as info:
        registry.entries()
    message = str(info.value)
    assert message.startswith(f"registry file {path}: entry ")
    assert missing in message


def test_nonexistent_registry_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.toml"
    use_registry(monkeypatch, missing)
    with pytest.raises(RegistryFormatError) as info:
        registry.resolve("demo")
    assert str(missing) in str(info.value)
    assert "RLDS_REGISTRY" in str(info.value)
    assert "RLDS_REGISTRY" in info.value.hint


def test_registry_errors_in_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_registry(monkeypatch, tmp_path / "nowhere.toml")
    result = CliRunner().invoke(app, ["download", "demo"])
    assert result.exit_code == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: registry path ") and "nowhere.toml" in first


def test_remote_entry_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote entries are downloaded (tests/sources/test_download.py); offline, nothing is requested."""
    extra = tmp_path / "extra.toml"
    extra.write_text(EXTRA_TOML)
    use_registry(monkeypatch, extra)
    monkeypatch.setenv("RLDS_OFFLINE", "1")
    with pytest.raises(OfflineError) as info:
        download("extra")
    assert "extra-medium-v0.hdf5 is not downloaded" in str(info.value)
    assert not CacheRoot().datasets_dir.exists()


# --------------------------------------------------------------------------- download via the registry


def test_download_demo_via_registry(isolated_cache: Path) -> None:
    entry = registry.resolve("demo")
    result = download("demo")
    assert result.reused is False
    assert result.path == isolated_cache / "datasets" / DEMO_ID
    m = result.manifest
    assert m.name == DEMO_ID
    assert m.num_steps == entry.extra["source_rows"] == 5000
    assert m.num_episodes == entry.extra["num_episodes"] == 94
    assert m.source["id"] == DEMO_ID
    assert m.source["url"] == "bundled:pointmass-demo-v0.hdf5"
    assert m.source["sha256"] == DEMO_SHA256
    assert m.source["size"] == DEMO_SIZE
    assert m.source["format"] == "d4rl"
    assert m.source["options"] == {"max_episode_steps": 100}  # the registry's reader hint
    # the id and every alias land on the same dataset, reused
    for key in (DEMO_ID, "rlds/pointmass-demo-v0"):
        again = download(key)
        assert again.reused is True
        assert again.path == result.path
    assert [p.name for p in (isolated_cache / "datasets").iterdir()] == [DEMO_ID]
    # another name converts another copy
    assert download("demo", name="demo-copy").manifest.num_steps == 5000


def test_download_extra_bundled_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text(
        entry_toml(
            "my-points-v0",
            extra="max_episode_steps = 100",
            files=(
                '[[dataset.files]]\nname = "p.hdf5"\nurls = ["bundled:pointmass-demo-v0.hdf5"]\n'
                f'sha256 = "{DEMO_SHA256.upper()}"\n'
            ),
        )
    )
    use_registry(monkeypatch, extra)
    result = download("my-points-v0")
    assert result.manifest.name == "my-points-v0"
    assert result.manifest.source["id"] == "my-points-v0"
    assert result.manifest.num_steps == 5000


def test_registry_checksum_is_checked(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry.resolve("demo")
    wrong = "0" * 64
    patched = dataclasses.replace(real, listed_files=(dataclasses.replace(real.files[0], sha256=wrong),))
    monkeypatch.setattr(registry, "resolve", lambda key: patched)
    with pytest.raises(ChecksumMismatchError) as info:
        download("demo")
    assert wrong in str(info.value)
    assert DEMO_SHA256 in str(info.value)
    assert "pointmass-demo-v0.hdf5" in str(info.value)
    assert not CacheRoot().exists(DEMO_ID)
    for sub in ("datasets", "tmp"):
        folder = isolated_cache / sub
        assert not folder.exists() or not list(folder.iterdir())
    # with the right checksum it converts
    monkeypatch.setattr(registry, "resolve", lambda key: real)
    assert download("demo").manifest.num_steps == 5000


def test_explicit_options_override_registry_hints(isolated_cache: Path) -> None:
    result = download("demo", name="demo-50", options={"max_episode_steps": 50, "unused": None})
    assert result.manifest.source["options"] == {"max_episode_steps": 50}


# --------------------------------------------------------------------------- search, published figures


def test_search_by_substring_glob_alias_and_description() -> None:
    ids = [e.id for e in registry.search("HOPPER-MEDIUM-V2")]  # case is ignored
    assert ids == ["hopper-medium-v2"]
    hoppers = [e.id for e in registry.search("mujoco/hopper/*")]  # a glob over the whole id
    assert hoppers == sorted(hoppers) and "mujoco/hopper/expert-v0" in hoppers
    assert all(i.startswith("mujoco/hopper/") for i in hoppers)
    assert {e.id for e in registry.search("mujoco/h*/simple-v0")} == {
        "mujoco/halfcheetah/simple-v0",
        "mujoco/hopper/simple-v0",
    }
    assert [e.id for e in registry.search("rlds/pointmass*")] == [DEMO_ID]  # an alias, as a glob
    assert [e.id for e in registry.search("roboset/DAPG_expert/door")] == ["DAPG(expert)/door_v2d-v1"]
    assert "hopper-medium-v2" in [e.id for e in registry.search("gym_mujoco_v2 suite")]  # description
    assert registry.search("no-such-thing-anywhere") == []
    assert registry.matches("a*c", "ABC") and not registry.matches("a*c", "abcd")
    assert registry.matches("b", "abc") and not registry.matches("x", "abc", "def")


def test_search_ranks_whole_words_before_letters_inside_a_word() -> None:
    """``hopper`` lists the Hopper datasets first, ChopperCommand (whose id only contains the
    letters) after every id where the word starts, and description-only matches last."""
    ids = [e.id for e in registry.search("hopper")]
    chopper = [i for i in ids if "ChopperCommand" in i]
    assert chopper and ids[-len(chopper) :] == sorted(chopper)
    first = ids[: len(ids) - len(chopper)]
    prefix = [i for i in first if i.startswith("hopper")]
    assert first[: len(prefix)] == sorted(prefix) and "hopper-medium-v2" in prefix
    assert {"bullet-hopper-medium-v0", "mujoco/hopper/expert-v0"} <= set(first[len(prefix) :])
    # an exact id or alias comes first of all, whatever its name sorts as
    assert next(e.id for e in registry.search("demo")) == DEMO_ID
    exact = [e.id for e in registry.search("hopper-medium-v2")]
    assert exact[0] == "hopper-medium-v2"
    # a word that only descriptions hold is found, after every id that holds it
    suite = [e.id for e in registry.search("suite")]
    assert suite and all(registry.resolve(i).description for i in suite)


@pytest.mark.parametrize(
    ("pattern", "names", "description", "rank"),
    [
        ("hopper-medium-v2", ["hopper-medium-v2"], "", registry.EXACT),
        ("DEMO", ["pointmass-demo-v0", "demo"], "", registry.EXACT),  # an alias, any case
        ("hopper", ["hopper-medium-v2"], "", registry.PREFIX),
        ("hopper", ["bullet-hopper-medium-v0"], "", registry.WORD),
        ("hopper", ["D4RL/hopper/x"], "", registry.WORD),
        ("command", ["atari_dqn/ChopperCommand/1"], "", registry.WORD),  # a capital starts a word
        ("hopper", ["atari_dqn/ChopperCommand/1"], "", registry.INSIDE),
        ("suite", ["x"], "D4RL, gym_mujoco suite", registry.DESCRIPTION_WORD),
        ("ujoco", ["x"], "D4RL, gym_mujoco suite", registry.DESCRIPTION),
        ("walker", ["x"], "D4RL, gym_mujoco suite", None),
        ("mujoco/h*", ["mujoco/hopper/simple-v0"], "", registry.EXACT),  # a glob: whole names
        ("*suite", ["x"], "D4RL, gym_mujoco suite", registry.DESCRIPTION),
        ("mujoco/h*", ["x/mujoco/hopper"], "", None),
    ],
)
def test_match_rank(pattern: str, names: list[str], description: str, rank: int | None) -> None:
    assert registry.match_rank(pattern, names, description) == rank
    assert registry.matches(pattern, *names, description) == (rank is not None)


def test_did_you_mean() -> None:
    with pytest.raises(UnknownDatasetIdError) as info:
        registry.resolve("hoper-medium-v2")
    assert info.value.hint.startswith("did you mean 'hopper-medium-v2'")
    assert "local path" not in info.value.hint


def test_published_figures_are_parsed_and_shown_as_approximate() -> None:
    entry = registry.resolve("D4RL/door/cloned-v2")
    assert entry.published is not None
    assert (entry.published.steps, entry.published.episodes, entry.published.size_bytes) == (
        1_000_000,
        4356,
        1_077_700_000,
    )
    assert "Minari" in entry.published.source
    assert all(f.size is None for f in entry.files)  # a rounded figure never checks a download
    assert "published" not in entry.extra
    counted = [e.id for e in registry.entries() if e.published is not None]
    # the reference quotes five; "antmaze-large" names no single id and is left out
    assert sorted(counted) == [
        "D4RL/door/cloned-v2",
        "D4RL/door/expert-v2",
        "mujoco/halfcheetah/simple-v0",
        "mujoco/hopper/expert-v0",
    ]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[dataset.published]\nsteps = 10\n", "'published' (a table with a 'source'"),
        ('[dataset.published]\nsource = "x"\nsteps = -1\n', "'published.steps' (-1 is not a positive"),
        ('[dataset.published]\nsource = "x"\nsize_bytes = "1 GB"\n', "'published.size_bytes' ('1 GB'"),
    ],
    ids=["no-source", "negative", "string"],
)
def test_bad_published_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, message: str
) -> None:
    path = tmp_path / "pub.toml"
    files = '[[dataset.files]]\nname = "a"\nurls = ["https://x.org/a"]\n'
    path.write_text(f'[[dataset]]\nid = "pub-v0"\nformat = "d4rl"\n{table}\n{files}')
    use_registry(monkeypatch, path)
    with pytest.raises(RegistryFormatError) as info:
        registry.entries()
    assert message in str(info.value)
