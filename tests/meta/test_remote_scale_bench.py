"""benchmarks/remote_scale_bench.py's report on stand-in results: rounds combined (the median
rate, the largest disk use, a failure kept), the goals judged on the right cases, the features of
the installed rlds named, and disk use counted as the files' bytes. The run itself needs the
benchmark environment (Mosaic Streaming, MuJoCo): ``make bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pytest.importorskip("torch")

import remote_scale_bench as bench


def _round(rate: float, peak: int = 0) -> dict[str, Any]:
    return {
        "setup": 1.0,
        "batches": 11,
        "seconds": 10 / rate,
        "requests": 5,
        "fetched": 1e6,
        "peak_disk": peak,
    }


def test_rounds_combine_to_the_median_rate_and_the_largest_disk_use() -> None:
    row = bench.combine([_round(2.0, 10), _round(4.0, 30), _round(3.0, 20)])
    assert row["rate"] == pytest.approx(3.0) and sorted(row["rates"]) == pytest.approx([2.0, 3.0, 4.0])
    assert row["peak_disk"] == 30 and row["batches"] == 11


def test_a_failed_round_is_the_row() -> None:
    row = bench.combine([_round(2.0), {**_round(1.0), "error": "IndexError: Relative sample index 4"}])
    assert row["error"] == "IndexError: Relative sample index 4 (1 of 2 rounds)"


def test_the_report_judges_the_goals_and_names_the_features(tmp_path: Path) -> None:
    limit = 100_000_000
    results = {
        "local": bench.combine([_round(10.0)]),
        "bounded": bench.combine([_round(9.0, peak=90_000_000)]),
        "mosaic": bench.combine([_round(3.0, peak=130_000_000)]),
        "mosaic-default": {**_round(1.0, peak=50_000_000), "error": "IndexError: x (1 of 1 rounds)"},
    }
    facts = {
        "size": 1000, "dataset_bytes": 10 * limit, "cache_limit": limit, "shard_bytes": 10, "frame_kb": 22.0,
        "features": {"cache_limit": True, "read_ahead": True, "blocks": False}, "sampler": "epoch",
        "latency_ms": "20-50", "bandwidth_mbs": 100.0, "cache_fraction": 0.1, "workers": 2,
        "read_ahead": 4, "shuffle_block": 25, "store_mbs": 50.0,
    }  # fmt: skip
    args = argparse.Namespace(quick=True, write=None, keep=False)
    run = bench._harness.Run(args=args, repeats=1, seconds=5.0, steps=0, work=tmp_path)
    section = bench.report(run, results, facts)
    assert "it has cache_limit, read_ahead." in section
    # the pulled copy: 10 batches/s of 256 steps of 1 MB each, 2,560 MB/s: the store's 50 bounds it
    assert "The store alone serves 50 MB/s" in section and "bounded by 0.02x of it" in section
    assert "--latency-ms 20,50 --bandwidth-mbs 100" in section
    assert "bounded) over the pulled copy: 0.90x (goal >= 0.8x): **met**" in section
    assert "bounded) over Mosaic from S3: 3.00x (goal > 1x): **met**" in section
    assert "- bounded: max disk use 90.0 MB of a 100.0 MB limit: **met**" in section
    assert "- mosaic: max disk use 130.0 MB of a 100.0 MB limit: **not met**" in section
    assert "failed: `IndexError: x (1 of 1 rounds)`" in section
    assert "rlds, S3, bounded cache (`cache_limit`, `read_ahead=4`)" in section
    assert section.startswith(bench._harness.markers("remote")[0])


def test_disk_use_is_the_bytes_of_the_files(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"1" * 300)
    (tmp_path / "y").write_bytes(b"2" * 5)
    assert bench.disk_use(tmp_path) == 305
    assert bench.disk_use(tmp_path / "gone") == 0
