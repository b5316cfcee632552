"""Hub-hosted registry entries (issue 28, part 4): which ids come from the Hugging Face Hub, by
repo, read from the URLs and listings the registry already holds (no repo id is made up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.catalog import registry
from rlds_cli.catalog.registry import hub_repos, hub_source
from rlds_cli.cli.app import app

runner = CliRunner()


def test_minari_ids_come_from_their_farama_minari_repo_folder() -> None:
    minari = [e for e in registry.entries() if e.format == "minari"]
    assert minari
    for entry in minari:
        src = hub_source(entry)
        assert src is not None, entry.id
        # Minari's remote layout: repo farama-minari/<first part of the id>, folder <the rest>
        first, rest = entry.id.split("/", 1)
        assert (src.repo, src.path, src.revision) == (f"farama-minari/{first}", rest, "main"), entry.id
        assert src.url == f"hf://datasets/farama-minari/{first}/{rest}"


def test_listed_folders_and_other_hosts() -> None:
    door = registry.resolve("DAPG(expert)/door_v2d-v1")
    assert hub_source(door) is not None and hub_source(door).repo == "jdvakil/RoboSet_Sim"  # type: ignore[union-attr]
    assert hub_source(door).path == "DAPG(expert)/door_v2d-v1"  # type: ignore[union-attr]
    d4rl = [e for e in registry.entries() if e.format == "d4rl"]
    assert d4rl and all(hub_source(e) is None for e in d4rl)  # rail.eecs.berkeley.edu, not the Hub
    repos = hub_repos(registry.entries())
    assert {"farama-minari/D4RL", "farama-minari/mujoco", "jdvakil/RoboSet_Sim"} <= set(repos)
    assert all(r.split("/")[0] in ("farama-minari", "jdvakil", "conglu") for r in repos)


def test_list_remote_says_which_ids_come_from_the_hub(isolated_cache: Path) -> None:
    out = runner.invoke(app, ["list", "--remote", "farama-minari/D4RL", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["datasets"]
    ids = {r["id"] for r in rows}
    want = {e.id for e in registry.entries() if (s := hub_source(e)) and s.repo == "farama-minari/D4RL"}
    assert ids == want and all(r["hub_repo"] == "farama-minari/D4RL" for r in rows)
    table = runner.invoke(app, ["list", "--remote", "pen"], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "farama-minari/D4RL" in table.output
    assert "come from the Hugging Face Hub" in table.output
    d4rl = runner.invoke(app, ["list", "--remote", "maze2d-open-v0", "--json"])
    assert json.loads(d4rl.output)["datasets"][0]["hub_repo"] is None


@pytest.mark.parametrize("pattern", ["hf://datasets/farama-minari/mujoco", "FARAMA-MINARI/mujoco/hopper"])
def test_a_repo_url_or_folder_lists_its_ids(isolated_cache: Path, pattern: str) -> None:
    out = runner.invoke(app, ["list", "--remote", pattern, "-q"])
    assert out.exit_code == 0, out.output
    ids = out.output.split()
    assert ids and all(i.startswith("mujoco/") for i in ids)
    if "hopper" in pattern:
        assert all(i.startswith("mujoco/hopper/") for i in ids)
