"""TensorDict section: ``as_tensordict=True`` batches (what TorchRL's losses take) against the plain
batches of the same loaders (issue 38: at least 0.8x their rate), for ``Loader`` and
``MixtureLoader``, uniform and slice, on generated low-dim data (``benchmarks/data.py``), batch 256.

Each configuration is measured three ways in one process, cases visited in turn: the plain batch
(a ``TedBatch`` of torch tensors), the TensorDict batch, and the plain batch wrapped by the
``TensorDict`` constructor (``TensorDict(batch.nested(), batch_size=...)``, the wrap every
TensorDict batch paid before issue 38). Usage: ``python benchmarks/tensordict_bench.py [--write
FILE] [--quick] [--device cuda]``: with ``--device cuda`` every loader delivers its batches on the
GPU (``device="cuda"``: pinned host buffers, copies on a side stream) and every call ends with
``torch.cuda.synchronize()``, so a batch is timed until it is on the device.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness
import data as bench_data
import torch
from _harness import Case
from _sides import BATCH, SLICE_LEN, SLICES

SECTION = "tensordict"
#: The configurations: key -> what its rows say.
CONFIGS = {
    "uniform": "`Loader`, uniform, memmap",
    "uniform-ram": "`Loader`, uniform, `in_memory=True`",
    "slice": f"`Loader`, slices {BATCH // SLICE_LEN}x{SLICE_LEN}, memmap",
    "mix": "`MixtureLoader`, two datasets 50/50, memmap",
    "mix-slice": f"`Loader(MixtureSource(...))`, slices {BATCH // SLICE_LEN}x{SLICE_LEN}, memmap",
}
#: The sampler's extras of each configuration that has some (TorchRL's keys in a TensorDict).
EXTRAS = {"slice": ("mask",), "mix-slice": ("mask",)}
#: The issue's goal: TensorDict batches at this fraction of the plain rate, or better.
TARGET = 0.8
#: Paired ratios: TensorDict over plain, and the constructor's wrap over plain.
PAIRS = [(f"{side}-{c}", f"plain-{c}") for c in CONFIGS for side in ("td", "ctor")]
_log = _harness.logger(SECTION)


def datasets(steps: int, work: Path) -> tuple[Any, Any]:
    """The main dataset (``steps`` steps, 1000-step episodes) and a mixture's second one (a fifth of
    it, 200-step episodes), built once in ``work``."""
    main = bench_data.ensure(work / "root", f"lowdim-{steps}", lambda: bench_data.lowdim_blocks(steps))
    small = steps // 5
    other = bench_data.ensure(
        work / "root", f"lowdim-{small}-200", lambda: bench_data.lowdim_blocks(small, length=200)
    )
    return main, other


def loaders(ds: Any, other: Any, as_tensordict: bool, seed: int, device: str = "cpu") -> dict[str, Any]:
    """One loader per configuration, plain or TensorDict batches, delivered on ``device``."""
    from rlds_cli.loader import Loader, MixtureLoader, MixtureSource

    opts = {"seed": seed, "as_tensordict": as_tensordict, "device": device}
    make = functools.partial(Loader, ds, BATCH, **opts)
    sources = {"offline": ds, "online": other}
    return {
        "uniform": make(),
        "uniform-ram": make(in_memory=True),
        "slice": make(**SLICES),
        "mix": MixtureLoader(sources, [0.5, 0.5], BATCH, **opts),
        "mix-slice": Loader(MixtureSource(sources), BATCH, **opts, **SLICES),
    }


def on_device(call: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``call``, timed until its batch is on ``device`` (a CUDA call ends with a synchronize)."""
    if not device.startswith("cuda"):
        return call

    def synced() -> Any:
        out = call()
        torch.cuda.synchronize()
        return out

    return synced


def constructor_wrap(loader: Any, extras: tuple[str, ...]) -> Callable[[], Any]:
    """``loader.sample()`` (plain) wrapped by the ``TensorDict`` constructor as before issue 38:
    the sampler's ``extras`` renamed to TorchRL's keys, nested dicts, every key checked."""
    from tensordict import TensorDict

    from rlds_cli.cache.ted import TedBatch
    from rlds_cli.loader.tensors import torchrl_paths

    def call() -> Any:
        batch = loader.sample()
        renamed = TedBatch(zip(torchrl_paths(batch, extras), batch.values(), strict=True))
        return TensorDict(renamed.nested(), batch_size=tuple(batch["index"].shape))

    return call


def build_cases(ds: Any, other: Any, device: str = "cpu") -> list[Case]:
    """Per configuration: plain, TensorDict, and the constructor's wrap of the plain batch."""
    # other seeds: a pair's calls alternate, and the same draws would find the other side's rows
    # in the CPU caches (TensorDict ~1.4x faster than plain on memmap in a trial)
    plain, td = loaders(ds, other, False, 0, device), loaders(ds, other, True, 1, device)
    cases = []
    for key, label in CONFIGS.items():
        ctor = constructor_wrap(plain[key], EXTRAS.get(key, ()))
        cases += [
            Case(f"plain-{key}", f"{label}: plain batch", on_device(plain[key].sample, device)),
            Case(f"td-{key}", f"{label}: `as_tensordict=True`", on_device(td[key].sample, device)),
            Case(f"ctor-{key}", f"{label}: plain + `TensorDict(...)` constructor", on_device(ctor, device)),
        ]
    return cases


def check_same_batches(ds: Any, other: Any, device: str = "cpu") -> None:
    """The TensorDict batch holds the plain batch's tensors (same seed, same draws)."""
    plain, td = loaders(ds, other, False, 0, device), loaders(ds, other, True, 0, device)
    for key in CONFIGS:
        a, b = plain[key].sample(), td[key].sample()
        if not torch.equal(a["index"], b["index"]) or not torch.equal(
            a["next", "reward"], b["next", "reward"]
        ):
            raise SystemExit(f"{key}: the TensorDict batch is not the plain batch")


def render(cases: dict[str, Case], info: dict[str, Any], paired: dict[tuple[str, str], list[float]]) -> str:
    """The Markdown section."""
    rows = []
    for key, label in CONFIGS.items():
        p, t, c = cases[f"plain-{key}"], cases[f"td-{key}"], cases[f"ctor-{key}"]
        tp, cp = paired[f"td-{key}", f"plain-{key}"], paired[f"ctor-{key}", f"plain-{key}"]
        extra_us = (1 / statistics.median(tp) - 1) * 1e6 / p.rate  # the paired ratio's, steadier
        rows.append(
            [
                label,
                p.fmt(),
                t.fmt(),
                c.fmt(),
                f"{extra_us:.1f}",
                _harness.span(tp, ".2f", "x"),
                _harness.span(cp, ".2f", "x"),
            ]
        )
    met = all(min(paired[f"td-{k}", f"plain-{k}"]) >= TARGET for k in CONFIGS)
    medians = [f"{k} {_harness.span(paired[f'td-{k}', f'plain-{k}'], '.2f', 'x')}" for k in CONFIGS]
    lines = [
        *_harness.opening(
            SECTION, "TensorDict batches: `as_tensordict=True` vs the plain batch (issue 38)", info["quick"]
        ),
        f"Workload: {info['steps']:,} steps (observation {bench_data.OBS_DIM} float32, action "
        f"{bench_data.ACT_DIM} float32, 1000-step episodes); the mixtures add a second dataset of "
        f"{info['steps'] // 5:,} steps (200-step episodes), 50/50. Batch {BATCH}; every batch is the full "
        "TED transition (observation, action, episode, next/observation, next/reward, next/done, "
        'next/terminated, next/truncated, index; slices add the mask, under `("collector", "mask")` '
        "in a TensorDict; mixtures add source). The TensorDict batches hold the same tensors as the "
        f"plain ones (checked before timing); batches delivered on {info['device']}. "
        f"Medians of {info['repeats']} interleaved rounds in one "
        "process (range in brackets).",
        "",
        *_harness.header(info, info["versions"]),
        "",
        *_harness.table(
            [
                "configuration",
                "plain, batches/s",
                "`as_tensordict=True`, batches/s",
                "plain + `TensorDict(...)` (before), batches/s",
                "TensorDict's extra us a batch (paired)",
                "TensorDict / plain (paired)",
                "before / plain (paired)",
            ],
            rows,
        ),
        "",
        f"- Goal: TensorDict batches at >= {TARGET}x the plain rate for every configuration, in every "
        f"round (paired; {', '.join(medians)}): {_harness.verdict(met)}.",
    ]
    notes = [
        "- Plain: `Loader(ds, 256, seed=0, ...).sample()` (a `TedBatch` of torch tensors). TensorDict: "
        "the same loader with `as_tensordict=True` and seed 1 (with the same draws, the second call of "
        "a pair would find the first's rows in the CPU caches); it builds each batch with "
        "`TensorDict._new_unsafe` from a nesting worked out once per key layout "
        "(`rlds_cli/loader/tensors.py`, `TensorDictBatches`). Before: the plain batch wrapped by "
        "`TensorDict(batch.nested(), batch_size=...)`, the constructor that checks and places every "
        "key (what `as_tensordict=True` did before issue 38, less the general loader path it also "
        "took).",
        f"- torch intra-op threads: {info['threads']}. Rates: each case visited in turn, a few calls a "
        "visit, one over the median call a round.",
        f"- Paired ratios: the two sides' calls alternate one by one for about {2 * info['seconds']:g} s, "
        "and the ratio is that of their median call times (both see the same moments of the shared "
        "machine); median of the rounds, range in brackets. The goal is judged on every round's paired "
        "ratio.",
    ]
    return "\n".join(lines + _harness.closing(SECTION, info["command"], notes))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "as_tensordict=True batches vs plain batches",
        SECTION,
        work="tensordict",
        steps=(1_000_000, 100_000),
        repeats=(5, 2),
        seconds=(0.5, 0.2),
    )
    p.add_argument("--device", default="cpu", help="where batches are delivered (cpu, cuda)")
    args = p.parse_args(argv)
    run = _harness.start(args)
    t = time.perf_counter()
    ds, other = datasets(run.steps, run.work)
    for d in (ds, other):
        _harness.warm_dataset(d)
    _log(
        f"datasets of {ds.num_steps:,} and {other.num_steps:,} steps ready ({time.perf_counter() - t:.1f} s)"
    )
    check_same_batches(ds, other, args.device)
    cases = build_cases(ds, other, args.device)
    _log(f"{len(cases)} cases, {run.repeats} rounds:")
    _harness.rounds(cases, run.repeats, run.seconds, _log)
    _log(f"paired ratios, {run.repeats} rounds:")
    by_key = {c.key: c for c in cases}
    paired = _harness.measure_pairs(by_key, PAIRS, run.repeats, 2 * run.seconds, _log)
    info = run.info(
        versions=_harness.versions("rlds-cli", "tensordict", "numpy") + f", torch {torch.__version__}",
        steps=run.steps,
        threads=torch.get_num_threads(),
        device=args.device + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""),
        command="python benchmarks/tensordict_bench.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    run.publish(SECTION, render(by_key, info, paired), _log)
    run.remove(run.work / "root")
    return 0


if __name__ == "__main__":
    sys.exit(main())
