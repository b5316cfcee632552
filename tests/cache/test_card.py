"""Dataset cards and licences (cache/card.py, remote/hub_push.py): ``--license``/``--citation``
and what sources declare are kept in the manifest, carried into views, merges, trims, downsamples
and preprocess outputs, written as README.md + croissant.json on a Hub push, and a mixture of
incompatible licences says so in its report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cache.card import combine_cards, declared_card, license_conflicts, spdx_id
from rlds_cli.cache.compose import downsample_dataset, merge_datasets, trim_dataset
from rlds_cli.cache.derive import create_view
from rlds_cli.cli.app import app
from rlds_cli.errors import UnknownLicenseError
from rlds_cli.inspection.summary import describe
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.formats_fixtures import refused
from tests.loader_fixtures import make_ted

runner = CliRunner()
CITE = "@article{fu2020d4rl, title={D4RL}}"


def card(name: str) -> dict[str, Any]:
    return describe(open_dataset(name), statistics=False)["card"]


def test_spdx_ids_are_checked_and_written_canonically() -> None:
    assert spdx_id("cc-by-nc-4.0") == "CC-BY-NC-4.0" and spdx_id(" MIT ") == "MIT"
    with pytest.raises(UnknownLicenseError, match=r"'CC-BY-5\.0' is no SPDX id"):
        spdx_id("CC-BY-5.0")


@pytest.mark.parametrize(
    ("licenses", "needle"),
    [
        ([("a", "CC-BY-NC-4.0"), ("b", "MIT")], "a (CC-BY-NC-4.0) may not be used commercially, b (MIT) may"),
        ([("a", "CC-BY-SA-4.0"), ("b", "GPL-3.0-only")], "share-alike terms that exclude each other"),
        ([("a", "CC-BY-ND-4.0"), ("b", "CC-BY-4.0")], "a (CC-BY-ND-4.0) may not be adapted"),
        ([("a", "CC-BY-4.0"), ("b", "MIT"), ("c", "Apache-2.0")], None),
        ([("a", "CC-BY-NC-4.0"), ("b", "CC-BY-NC-SA-4.0")], None),
    ],
)
def test_the_licence_compatibility_table(licenses: list[tuple[str, str]], needle: str | None) -> None:
    conflicts = license_conflicts(licenses)
    if needle is None:
        assert conflicts == []
    else:
        assert any(needle in c for c in conflicts), conflicts


def test_what_sources_declare_and_how_cards_combine() -> None:
    lerobot = {"lerobot": {"license": "apache-2.0", "robot_type": "aloha", "fps": 50}}
    assert declared_card(lerobot, "CC-BY-4.0") == {
        "license": "Apache-2.0", "license_from": "lerobot", "robot_type": "aloha", "fps": 50,
    }  # fmt: skip
    minari = {"minari": {"description": "door opening"}}
    assert declared_card(minari, "CC-BY-4.0") == {
        "description": "door opening", "license": "CC-BY-4.0", "license_from": "registry",
    }  # fmt: skip
    assert declared_card({}, "unknown (see the OGBench README)") == {}
    both = combine_cards(
        [{"license": "MIT", "citation": "x"}, {"license": "CC-BY-NC-4.0", "citation": "x"}], ["a", "b"]
    )
    assert both["license"] == ["CC-BY-NC-4.0", "MIT"] and both["citation"] == "x"
    assert "non-commercially only" in both["license_conflicts"][0]
    assert combine_cards([{"license": "MIT"}, {}])["license"] == ["MIT", "unknown"]


def test_license_and_citation_are_kept_and_carried(tmp_path: Path) -> None:
    download("demo", license="cc-by-nc-4.0", citation=CITE)
    assert card("pointmass-demo-v0") == {"license": "CC-BY-NC-4.0", "license_from": "user", "citation": CITE}
    create_view("pointmass-demo-v0", "v", (0, 3))  # a view shows its parent's card
    assert card("v")["license"] == "CC-BY-NC-4.0"
    trim_dataset("v", "t", start=1, end=1)
    downsample_dataset("t", "d", 2)
    for name in ("t", "d"):
        assert card(name)["citation"] == CITE and card(name)["license"] == "CC-BY-NC-4.0"
    from rlds_cli.preprocess import job as preprocess_job

    preprocess_job.run("v", "tests.preprocess_fns:add_features", "p", workers=1)
    assert card("p")["license"] == "CC-BY-NC-4.0"
    home = Path(os.environ["RLDS_HOME"])
    make_ted(home, "mit", [50, 50])
    convert(home / "mit.hdf5", "mit", format="d4rl", license="MIT", force=True)
    with pytest.raises(UnknownLicenseError):
        convert(home / "mit.hdf5", "x", format="d4rl", license="nope")


def test_the_registry_licence_is_the_default() -> None:
    download("demo")  # registry/demo.toml: Apache-2.0
    assert card("pointmass-demo-v0") == {"license": "Apache-2.0", "license_from": "registry"}


def test_cli_flags_and_refusal(tmp_path: Path) -> None:
    result = runner.invoke(app, ["download", "demo", "--license", "CC-BY-4.0", "--citation", CITE, "-q"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["inspect", "pointmass-demo-v0", "--no-stats"]).stdout
    assert "license  CC-BY-4.0 (from user); citation given" in shown
    assert (
        json.loads(runner.invoke(app, ["inspect", "pointmass-demo-v0", "--json"]).stdout)["card"]["citation"]
        == CITE
    )
    bad = runner.invoke(app, ["download", "demo", "--name", "other", "--license", "CC-BY-5"])
    refused(bad, "licence 'CC-BY-5' is no SPDX id rlds knows", hint=True, published=("pointmass-demo-v0",))


def test_a_mixture_of_incompatible_licences_says_so(tmp_path: Path) -> None:
    from rlds_cli import MixtureLoader

    home = Path(os.environ["RLDS_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    make_ted(home, "a", [20, 20])
    make_ted(home, "b", [20, 20])
    convert(home / "a.hdf5", "a", format="d4rl", license="CC-BY-NC-4.0", force=True)
    convert(home / "b.hdf5", "b", format="d4rl", license="Apache-2.0", force=True)
    mix = MixtureLoader({"sim": "a", "real": "b"}, weights={"sim": 0.5, "real": 0.5}, batch_size=4, seed=0)
    next(iter(mix.stream()))
    report = mix.report()
    assert report["licenses"]["sim"] == "CC-BY-NC-4.0" and report["licenses"]["real"] == "Apache-2.0"
    assert "the mix may be used non-commercially only" in report["licenses"]["conflicts"][0]
    same = MixtureLoader({"x": "b", "y": "b"}, weights={"x": 0.5, "y": 0.5}, batch_size=4, seed=0)
    assert "licenses" not in same.report()
    merged = merge_datasets(["a", "b"], "ab")
    assert merged.card["license"] == ["Apache-2.0", "CC-BY-NC-4.0"] and merged.card["license_conflicts"]
    # a view of the merge named the merge on both sides: "ab (CC-BY-NC-4.0) may not ..., ab (Apache-2.0) may"
    assert runner.invoke(app, ["view", "ab", "--episodes", "0:3", "--name", "abv"]).exit_code == 0
    view_card = open_dataset("abv").manifest.card
    assert view_card["license_conflicts"] == merged.card["license_conflicts"]
    assert "a (CC-BY-NC-4.0)" in view_card["license_conflicts"][0]
    # a selection holding one parent's episodes alone had every parent's licences and conflicts
    assert runner.invoke(app, ["view", "ab", "--episodes", "0:2", "--name", "a-only"]).exit_code == 0
    assert runner.invoke(app, ["drop", "ab", "--episodes", "0:2", "--name", "b-only"]).exit_code == 0
    assert open_dataset("a-only").manifest.card == {"license": "CC-BY-NC-4.0", "license_from": "user"}
    assert open_dataset("b-only").manifest.card == {"license": "Apache-2.0", "license_from": "user"}


def test_a_hub_push_writes_the_card_and_croissant(hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    yaml = pytest.importorskip("yaml")
    from rlds_cli.remote.push import push
    from tests.hub_standin import TOKEN

    hub.add_repo("rlds-test/cards", {".gitattributes": b"*.npy filter=lfs\n", "README.md": b"# cards\n"})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    download("demo", license="CC-BY-4.0", citation=CITE)
    push("pointmass-demo-v0", "hf://datasets/rlds-test/cards/demo")
    repo = hub.repos["rlds-test/cards"]
    everything = repo.commits[repo.refs["main"]]
    assert everything["README.md"] == b"# cards\n"  # the repo owner's stays
    files = {k.removeprefix("demo/"): v for k, v in everything.items() if k.startswith("demo/")}
    readme = files["README.md"].decode()
    front = readme.split("---\n")[1]
    assert 'license: "cc-by-4.0"' in front and 'pretty_name: "pointmass-demo-v0"' in front
    meta = yaml.safe_load(front)  # the front matter the Hub reads
    assert meta["license"] == "cc-by-4.0" and meta["citation"] == CITE and "lineage" not in meta
    assert meta["statistics"]["num_steps"] == open_dataset("pointmass-demo-v0").num_steps
    assert meta["statistics"]["keys"]["observation"] == {"shape": [6], "dtype": "float32"}
    doc = json.loads(files["croissant.json"])
    assert doc["@type"] == "sc:Dataset" and doc["conformsTo"] == "http://mlcommons.org/croissant/1.0"
    assert doc["@context"]["cr"] == "http://mlcommons.org/croissant/" and doc["citeAs"] == CITE
    assert doc["license"] == ["https://spdx.org/licenses/CC-BY-4.0.html"]
    for key in ("name", "description", "url", "datePublished", "distribution"):
        assert doc[key], key
    pushed = {f["contentUrl"]: f["sha256"] for f in doc["distribution"]}
    assert "episodes.npy" in pushed and all(len(s) == 64 for s in pushed.values())
    import hashlib

    assert pushed["episodes.npy"] == hashlib.sha256(files["episodes.npy"]).hexdigest()
    np.testing.assert_equal(
        len(doc["distribution"]), len([p for p in files if p.startswith(("arrays/", "episodes"))])
    )


def test_croissant_loads_in_mlcroissant(tmp_path: Path) -> None:
    """Where mlcroissant is installed (it is no dependency of rlds: checked by hand with 1.0.x in a
    side environment, no warning), the Croissant file loads and says the licence."""
    mlc = pytest.importorskip("mlcroissant")
    from rlds_cli._util.io import sha256_file
    from rlds_cli.remote.hub_push import CROISSANT_FILE, card_files

    download("demo", license="MIT", citation=CITE)
    ds = open_dataset("pointmass-demo-v0")
    files = {p.name: (p.stat().st_size, sha256_file(p)) for p in ds.directory.glob("*.npy")}
    path = tmp_path / CROISSANT_FILE
    path.write_bytes(
        card_files(ds.manifest, card("pointmass-demo-v0"), files, "https://example.org/x")[CROISSANT_FILE]
    )
    loaded = mlc.Dataset(jsonld=str(path))
    assert loaded.metadata.name == "pointmass-demo-v0"
    assert loaded.metadata.license == ["https://spdx.org/licenses/MIT.html"]
