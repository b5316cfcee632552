"""Registry file sets: many files written once as a pattern (the Atari DQN replay logs), expanded
when used, narrowed by a reader option, and downloaded from a real local HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.catalog import registry
from rlds_cli.cli.app import app
from rlds_cli.errors import RegistryError, RegistryFormatError
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.atari_dqn_fixtures import write_run
from tests.http_faults import FaultServer

runner = CliRunner()
SHAPE = (12, 10)
PARTS = (
    '["$store$_observation", "$store$_action", "$store$_reward", "$store$_terminal", '
    '"add_count", "invalid_range"]'
)


def file_set_toml(base: str, *, stop: int = 3, vars_: str | None = None, extra: str = "") -> str:
    vars_ = vars_ or f"{{ n = {{ start = 0, stop = {stop} }}, file = {PARTS} }}"
    return (
        '[[dataset]]\nid = "atari-local/Pong/1"\nformat = "atari_dqn"\ndescription = "d"\nlicense = "l"\n'
        "[dataset.file_set]\n"
        'name = "replay_logs/{file}_ckpt.{n}.gz"\n'
        f'urls = ["{base}/dqn/Pong/1/replay_logs/{{file}}_ckpt.{{n}}.gz"]\n'
        f"vars = {vars_}\n"
        'options = { checkpoints = "n" }\n' + extra
    )


@pytest.fixture(autouse=True)
def fresh_registry_cache() -> Iterator[None]:
    registry._load.cache_clear()
    yield
    registry._load.cache_clear()


def use(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    path = tmp_path / "sets.toml"
    path.write_text(text)
    monkeypatch.setenv("RLDS_REGISTRY", str(path))


# ----------------------------------------------------------------------------- expansion


def test_a_file_set_expands_in_order_with_urls_percent_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, tmp_path, file_set_toml("https://example.org"))
    entry = registry.resolve("atari-local/Pong/1")
    assert entry.listed_files == () and not entry.is_bundled
    names = [f.name for f in entry.files]
    assert len(names) == 18 and len(set(names)) == 18
    assert names[:2] == ["replay_logs/$store$_observation_ckpt.0.gz", "replay_logs/$store$_action_ckpt.0.gz"]
    assert names[-1] == "replay_logs/invalid_range_ckpt.2.gz"  # the first variable varies slowest
    assert entry.files[0].urls == (
        "https://example.org/dqn/Pong/1/replay_logs/%24store%24_observation_ckpt.0.gz",
    )


@pytest.mark.parametrize(
    ("spec", "numbers"),
    [("1:", [1, 2]), (":1", [0]), ("0,2", [0, 2]), (2, [2]), ([0, 1], [0, 1]), (None, [0, 1, 2])],
)
def test_an_option_narrows_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: object, numbers: list[int]
) -> None:
    use(monkeypatch, tmp_path, file_set_toml("https://example.org"))
    files = registry.resolve("atari-local/Pong/1").files_for({"checkpoints": spec})
    assert sorted({int(f.name.rsplit(".", 2)[1]) for f in files}) == numbers
    assert len(files) == 6 * len(numbers)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("5:9", "checkpoints='5:9' picks no file: this entry has n 0..2"),
        ("1,7", "checkpoints='1,7' picks missing n [7]: this entry has n 0..2"),
        ("x", "checkpoints='x' is not a range 'A:B' or a list of numbers"),
        ("3:1", "checkpoints='3:1' is not a range 'A:B' or a list of numbers"),
    ],
)
def test_a_bad_narrowing_option_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    use(monkeypatch, tmp_path, file_set_toml("https://example.org"))
    with pytest.raises(RegistryError) as info:
        registry.resolve("atari-local/Pong/1").files_for({"checkpoints": spec})
    assert str(info.value) == message and "checkpoints" in info.value.hint


@pytest.mark.parametrize(
    ("vars_", "message"),
    [
        ('{ n = { start = 0, stop = 2 }, file = [".."] }', "'file_set.vars.file' ('..' is not a plain"),
        ('{ n = { start = 0, stop = 2 }, file = ["a/b"] }', "'file_set.vars.file' ('a/b' is not a plain"),
        ('{ n = { start = 0, stop = 2 }, file = ["a\\\\b"] }', "is not a plain file-name part"),
        ('{ n = { start = 3, stop = 3 }, file = ["a"] }', "'file_set.vars.n' ({ start = A, stop = B }"),
        ("{ n = { start = 0, stop = 2 }, file = [] }", "'file_set.vars.file' (a non-empty list"),
        ('{ n = { start = 0, stop = 2 }, file = ["a"], extra = ["x"] }', "must use every variable"),
        ('{ file = ["a"] }', "uses ['n'], not in vars"),
        ('{ n = ["a", "b"], file = ["a"] }', "'file_set.options' ('checkpoints' must name a variable of"),
    ],
    ids=["dotdot", "slash", "backslash", "empty-range", "empty-list", "unused", "undeclared", "options"],
)
def test_a_bad_file_set_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vars_: str, message: str
) -> None:
    use(monkeypatch, tmp_path, file_set_toml("https://example.org", vars_=vars_))
    with pytest.raises(RegistryFormatError) as info:
        registry.entries()
    assert "entry 'atari-local/Pong/1' is missing or has a bad " in str(info.value)
    assert message in str(info.value)


def test_a_file_set_url_must_be_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, tmp_path, file_set_toml("ftp://example.org"))
    with pytest.raises(RegistryFormatError, match="is neither http"):
        registry.entries()


def test_the_packaged_atari_registry_is_small_and_expands_lazily() -> None:
    """250 ids x 306 files: the TOML stays small (159 KB, not 13.5 MB) and loading it expands no
    file set (an entry's files are built when asked for)."""
    path = registry.packaged_registry_dir() / "atari_dqn.toml"
    assert path.stat().st_size < 300_000
    entry = registry.resolve("atari_dqn/Pong/1")
    assert "files" not in vars(entry)  # the cached_property has not run
    assert len(entry.files) == 306
    assert len(entry.files_for({"checkpoints": "49:51"})) == 12


# ----------------------------------------------------------------------------- download


@pytest.fixture
def atari_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultServer, Path]]:
    logs = tmp_path / "src" / "Pong" / "1" / "replay_logs"
    run = write_run(logs, capacity=100, episode_lengths=[int(n) for n in np.full(12, 25)], obs_shape=SHAPE)
    assert len(run.checkpoints) >= 3
    with FaultServer() as srv:
        for path in logs.iterdir():
            srv.files["/dqn/Pong/1/replay_logs/" + path.name.replace("$", "%24")] = path.read_bytes()
        use(monkeypatch, tmp_path, file_set_toml(srv.base, stop=len(run.checkpoints)))
        monkeypatch.setenv("RLDS_RETRY_BASE_DELAY", "0.01")
        monkeypatch.delenv("RLDS_OFFLINE", raising=False)
        yield srv, logs


def test_download_fetches_only_the_picked_checkpoints(atari_server: tuple[FaultServer, Path]) -> None:
    srv, logs = atari_server
    download("atari-local/Pong/1", name="pong-1", options={"checkpoints": "1:3"}, keep_raw=True)
    fetched = sorted({e.path for e in srv.log if e.method == "GET"})
    assert len(fetched) == 12 and all("_ckpt.1.gz" in p or "_ckpt.2.gz" in p for p in fetched)
    convert(logs, "pong-local", options={"checkpoints": "1:3"})
    got, want = open_dataset("pong-1"), open_dataset("pong-local")
    assert got.num_steps == want.num_steps > 0
    for key in want.stored_fields:
        np.testing.assert_array_equal(np.asarray(got.column(key)[:]), np.asarray(want.column(key)[:]))


def test_download_without_the_option_fetches_every_file(atari_server: tuple[FaultServer, Path]) -> None:
    srv, logs = atari_server
    result = runner.invoke(app, ["download", "atari-local/Pong/1", "--name", "pong-all"])
    assert result.exit_code == 0, result.output
    assert len({e.path for e in srv.log if e.method == "GET"}) == len(list(logs.iterdir()))
    assert open_dataset("pong-all").num_steps > 0


def test_a_checkpoint_outside_the_entry_is_refused_before_any_request(
    atari_server: tuple[FaultServer, Path],
) -> None:
    srv, _ = atari_server
    with pytest.raises(RegistryError, match="picks missing n"):
        download("atari-local/Pong/1", name="x", options={"checkpoints": "0,40"})
    assert not srv.log


def test_the_cli_option_picks_the_checkpoints(atari_server: tuple[FaultServer, Path]) -> None:
    srv, _ = atari_server
    args = ["download", "atari-local/Pong/1", "--name", "pong-cli", "--option", "checkpoints=2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    fetched = {e.path for e in srv.log if e.method == "GET"}
    assert len(fetched) == 6 and all(p.endswith("_ckpt.2.gz") for p in fetched)
    meta = open_dataset("pong-cli").manifest.source["metadata"]["atari_dqn"]["checkpoints"]
    assert [c["checkpoint"] for c in meta] == [2]


def test_a_cli_option_that_picks_nothing_is_one_line(atari_server: tuple[FaultServer, Path]) -> None:
    srv, _ = atari_server
    result = runner.invoke(app, ["download", "atari-local/Pong/1", "--option", "checkpoints=7:9"])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "error: checkpoints='7:9' picks no file: this entry has n 0..2" and len(lines) <= 2
    assert not srv.log


def test_an_entry_may_carry_reader_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = file_set_toml("https://example.org").replace(
        'license = "l"', 'license = "l"\noptions = { stack_size = 1, checkpoints = "0:2" }'
    )
    use(monkeypatch, tmp_path, text)
    entry = registry.resolve("atari-local/Pong/1")
    assert entry.options == {"stack_size": 1, "checkpoints": "0:2"}
    assert len(entry.files_for(entry.options)) == 12


def test_entry_options_must_be_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = file_set_toml("https://example.org").replace('license = "l"', 'license = "l"\noptions = 3')
    use(monkeypatch, tmp_path, text)
    with pytest.raises(RegistryFormatError, match=r"a bad 'options' \(a table of reader options"):
        registry.entries()
