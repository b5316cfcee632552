"""``rlds verify``: re-check a cached dataset against what it was made from and its own files.

Which checks run depends on the dataset's kind (:func:`dataset_kind`): downloaded files against
their recorded hashes, the local source, the parents' versions, and the stored files' digests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlds_cli._util.io import sha256_file
from rlds_cli.cache.commit_log import segment_damage_hint
from rlds_cli.cache.composed import parts_of
from rlds_cli.cache.layout import SOURCE_ARRAYS_FILE
from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog import registry
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError
from rlds_cli.net.layout import HashStore, raw_dir


def dataset_kind(manifest: Any) -> str:
    """The dataset's kind: ``view``, ``growing`` (``DatasetWriter``), ``composed`` (``rlds merge``,
    ``trim``), ``downsampled``, ``preprocessed``, ``downloaded`` (has a download folder) or
    ``converted`` (from a local path or a bundled file)."""
    from rlds_cli.cache.layout import SEGMENTED_LAYOUT, VIEW_LAYOUT

    if manifest.layout == VIEW_LAYOUT:
        return "view"
    if manifest.layout == SEGMENTED_LAYOUT:
        return "growing"
    if manifest.layout == "composed":  # rlds merge, trim, drop of a merged one (cache/composed.py)
        return "composed"
    if manifest.source.get("format") == "rlds-downsample":
        return "downsampled"
    if manifest.source.get("format") == "rlds-preprocess" or any(p.get("fn") for p in manifest.lineage):
        return "preprocessed"
    if manifest.source.get("downloads"):
        return "downloaded"
    return "converted"


def _check(name: str, status: str, detail: str, hint: str | None = None, **extra: Any) -> dict[str, Any]:
    """One entry of ``checks`` (``status``: ``pass``, ``fail`` or ``skipped``); ``hint`` is kept
    only on a failure."""
    out: dict[str, Any] = {"check": name, "status": status, "detail": detail, **extra}
    if hint is not None and status == "fail":
        out["hint"] = hint
    return out


def verify(name: str, root: str | Path | CacheRoot | None = None) -> dict[str, Any]:
    """Check a dataset the way its kind allows, and say what was checked.

    * downloaded: the downloaded files' sha256 against the registry's (or the recorded) one,
      and the manifest's record of them;
    * converted from a local path: the source's sha256, when the source is still there;
    * view, preprocessed, composed, downsampled: each parent exists at the recorded version;
    * every dataset: every stored file is there at full size, every array's content digest is
      the one recorded at write.

    Args:
        name: A dataset name in the cache, or a registry id or alias.
        root: Cache root.

    Returns:
        A JSON-ready dict: ``kind``; ``checks`` (each ``check``, ``status`` ``pass``/``fail``/
        ``skipped``, ``detail``, and a ``hint`` when it failed); ``files`` (downloaded files,
        each ``ok``, ``mismatch`` or ``not kept``); ``manifest`` (the manifest checks, each with
        ``ok``); ``ok`` (``False`` when any check failed).

    Raises:
        DatasetNotFoundError: Neither a cached dataset nor downloaded files of that name.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    entry = registry.resolve(name) if not cache.exists(name) and registry.is_known(name) else None
    cache_name = entry.cache_name if entry else name
    try:
        manifest = cache.manifest(cache_name) if cache.exists(cache_name) else None
    except CorruptDatasetError as exc:  # nothing else can be checked against it
        return _unreadable_manifest(cache, cache_name, exc)
    folder = _raw_folder(cache, name, entry, manifest)
    if manifest is None and (folder is None or not HashStore(folder).exists()):
        raise DatasetNotFoundError(
            f"nothing to verify for {name!r}: no dataset of that name in the cache at {cache.path} "
            "and no downloaded files"
        )
    kind = dataset_kind(manifest) if manifest is not None else "download only"
    known = {f.name: f.sha256 for f in entry.files if f.sha256} if entry else {}
    files = _check_files(folder, known) if folder is not None else []
    checks = [_raw_file_check(f, cache_name) for f in files]
    legacy = _check_manifest(manifest, {f["name"]: f for f in files}) if manifest else []
    if manifest is None:
        checks.append(_check("cached dataset", "skipped", f"{cache_name!r} is downloaded but not converted"))
    else:
        checks += _legacy_checks(legacy, kind, manifest, cache_name)
        checks += _provenance_checks(kind, manifest, cache, legacy)
        checks += _dataset_checks(cache, cache_name, kind, legacy)
    ok = all(c["status"] != "fail" for c in checks)
    return {
        "name": cache_name,
        "kind": kind,
        "raw_dir": str(folder) if folder else None,
        "checks": checks,
        "files": files,
        "manifest": legacy,
        "ok": ok,
    }


def _unreadable_manifest(cache: CacheRoot, name: str, exc: CorruptDatasetError) -> dict[str, Any]:
    """The report of a dataset whose manifest cannot be trusted: that check failed; every other
    check needs the manifest (its files, digests and source are what it records)."""
    hint = (
        f"remove it ('rlds rm {name}') and make it again from its source (download, convert, or the "
        "command that derived it): its manifest, which records them, is damaged"
    )
    checks = [
        _check("manifest readable", "fail", exc.message, hint),
        _check("dataset files", "skipped", "checked against the manifest, which cannot be trusted"),
    ]
    return {
        "name": name,
        "kind": "unknown (damaged manifest)",
        "raw_dir": None,
        "checks": checks,
        "files": [],
        "manifest": [],
        "ok": False,
    }


def _redo_hint(kind: str, manifest: Any) -> str:
    """How to make the dataset again, by kind."""
    name, source = manifest.name, manifest.source
    if kind == "view":
        a, b = source.get("episodes", (0, 0))
        parent = source.get("parent")
        return f"make the view again ('rlds view {parent} --episodes {a}:{b} --name {name} --force')"
    if kind == "preprocessed":
        parent = manifest.lineage[0] if manifest.lineage else {}
        return (
            f"run the preprocessing again ('rlds preprocess {parent.get('name')} --fn {parent.get('fn')} "
            f"--name {name} --force')"
        )
    if kind in ("composed", "downsampled"):
        op = manifest.source.get("op", "downsample")
        command = "'rlds drop', 'view' or 'split'" if op == "select" else f"'rlds {op}'"
        return f"make it again from its parents (the same {command} command with --force)"
    if kind == "growing":  # nothing to make it again from: its episodes were written here
        return segment_damage_hint(name)
    if kind == "downloaded" or source.get("id"):
        return (
            f"download it again ('rlds download {source.get('id') or name} --name {name} --force'), or, "
            f"if it was pulled, pull it again ('rlds pull URL --name {name} --force')"
        )
    return (
        f"convert it again ('rlds download {source.get('path', 'PATH')} --name {name} --force'), or, "
        f"if it was pulled, pull it again ('rlds pull URL --name {name} --force')"
    )


#: Why a downloaded file's check is skipped, by its status (:func:`_raw_file_check`).
_SKIPPED_FILES = {
    "not kept": "not kept on disk (--no-keep-raw); its recorded sha256 still checks the next download",
    "gone": "no longer on disk: it was kept after its download and removed since; its recorded sha256 "
    "still checks the next download",
    "unconfirmed": "its sha256 was recorded at its first download and is confirmed only once the file "
    "converts",
}


def _raw_file_check(f: dict[str, Any], name: str) -> dict[str, Any]:
    label = f"downloaded file {f['name']}"
    if f["status"] in _SKIPPED_FILES:
        return _check(label, "skipped", _SKIPPED_FILES[f["status"]])
    if f["status"] == "failed to convert":
        return _check(
            label,
            "fail",
            "its last download did not convert (a file cut short or not the one expected): its recorded "
            "sha256 vouches for nothing",
            f"download it again ('rlds download {name}': the next run fetches it afresh)",
        )
    origin = f"the {f['origin']} sha256" if f["origin"] else "the recorded sha256"
    if f["status"] == "ok":
        return _check(label, "pass", f"sha256 {f['actual'][:16]}... matches {origin}")
    return _check(
        label,
        "fail",
        f"sha256 {f['actual']}, expected {f['expected']} ({f['origin']})",
        f"download it again ('rlds download {name} --force')",
    )


def _legacy_checks(legacy: list[dict[str, Any]], kind: str, manifest: Any, name: str) -> list[dict[str, Any]]:
    """The manifest's record of its downloaded files, as ``checks`` entries."""
    out = []
    for c in legacy:
        if c["check"] == "manifest source sha256":
            detail = "the manifest's source sha256 is its downloaded file's"
        elif c["actual"] is None:
            out.append(_check(c["check"], "skipped", "no downloaded file or recorded hash to compare with"))
            continue
        else:
            detail = "the sha256 it had at conversion is today's"
        if c["ok"]:
            out.append(_check(c["check"], "pass", detail))
        else:
            out.append(
                _check(
                    c["check"], "fail", f"{c['actual']}, expected {c['expected']}", _redo_hint(kind, manifest)
                )
            )
    return out


def _provenance_checks(
    kind: str, manifest: Any, cache: CacheRoot, legacy: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Where the dataset came from, by kind: the local source, or the parent's version."""
    if kind == "converted":
        check = _local_source_check(manifest, kind)
        if "actual" in check:  # one source file was re-hashed: also report it under ``manifest``
            legacy.append(
                {k: check[k] for k in ("check", "expected", "actual")} | {"ok": check["status"] == "pass"}
            )
        return [check]
    if kind == "view":
        source = manifest.source
        return _parent_checks(
            cache,
            str(source.get("parent")),
            source.get("parent_digest"),
            source.get("parent_created_at"),
            what="the view was made from",
            hint=_redo_hint(kind, manifest),
            gone_hint=f"remove the view ('rlds rm {manifest.name} --yes')",
            gone_fails=True,
        )
    if kind == "composed":
        # it reads its parts' parents (a selection of a merge: the merge's), each at a pinned version;
        # an ancestor it does not read (the merge itself) may be replaced or gone without harm
        parts = {(part.parent, part.parent_digest): None for part in parts_of(manifest)}
        out = []
        for parent, digest in parts:
            out += _parent_checks(
                cache, parent, digest, None, what="it reads", hint=_redo_hint(kind, manifest),
                gone_hint=f"remove it ('rlds rm {manifest.name} --yes')", gone_fails=True,
            )  # fmt: skip
        read = {parent for parent, _ in parts}
        for entry in manifest.lineage:
            if entry.get("name") not in read:
                out += _parent_checks(
                    cache, str(entry.get("name")), entry.get("digest"), entry.get("created_at"),
                    what="it was derived from", hint="", gone_hint=None, gone_fails=False,
                    unread=True,
                )  # fmt: skip
        return out
    if kind in ("preprocessed", "downsampled"):
        out = []
        for parent in manifest.lineage:
            out += _parent_checks(
                cache,
                str(parent.get("name")),
                parent.get("digest"),
                parent.get("created_at"),
                what="it was derived from",
                hint=_redo_hint(kind, manifest),
                gone_hint=None,
                gone_fails=False,
            )
        return out
    return []


def _parent_checks(
    cache: CacheRoot,
    parent: str,
    digest: str | None,
    created_at: str | None,
    *,
    what: str,
    hint: str,
    gone_hint: str | None,
    gone_fails: bool,
    unread: bool = False,
) -> list[dict[str, Any]]:
    """The parent exists and its manifest digest is the one recorded (the same version).

    A parent gone fails when ``gone_fails`` (the dataset reads the parent's arrays), else is skipped;
    a replaced one is skipped when ``unread`` (an ancestor whose arrays the dataset does not read)."""
    label = f"parent {parent}"
    if not cache.exists(parent):
        if gone_fails:
            return [_check(label, "fail", "it is no longer in the cache", gone_hint)]
        return [
            _check(
                label,
                "skipped",
                "it is no longer in the cache, so the lineage cannot be compared with it "
                "(the dataset's own data does not need it)",
            )
        ]
    try:
        current = cache.manifest(parent)
    except CorruptDatasetError as exc:  # its version cannot be read, nor anything of it trusted
        state = "fail" if gone_fails or not unread else "skipped"
        return [_check(label, state, exc.message, f"run 'rlds verify {parent}'")]
    out = [_check(label, "pass", f"exists at {cache.dataset_dir(parent)}")]
    version = f"{label} version"
    recorded = f"manifest {digest[:12]}" if digest else "no recorded digest"
    if created_at:
        recorded += f", written at {created_at}"
    if not digest:
        out.append(_check(version, "skipped", "the manifest records no digest of its parent"))
    elif current.digest() == digest:
        out.append(_check(version, "pass", f"the version {what}: {recorded}"))
    else:
        replaced = (
            f"it was replaced since: it is now manifest {current.digest()[:12]}, "
            f"written at {current.created_at}; {what} {recorded}"
        )
        if unread:
            out.append(_check(version, "skipped", replaced + " (the dataset does not read it)"))
        else:
            out.append(_check(version, "fail", replaced, hint))
    return out


def _local_source_check(manifest: Any, kind: str) -> dict[str, Any]:
    """The sha256 of the local source the dataset was converted from, when it is still there."""
    source = manifest.source
    path = source.get("path")
    if not path:
        return _check("source", "skipped", "the manifest records no source path")
    where = Path(path)
    label = f"source {path}"
    if not where.exists():
        return _check(
            label,
            "skipped",
            f"the source is gone from {path}; its sha256 cannot be compared (the dataset does not need it)",
        )
    hint = (
        "the source changed since the dataset was converted: if the new content is intended, "
        + _redo_hint(kind, manifest)
    )
    if where.is_file():
        actual = sha256_file(where)
        want = source.get("sha256")
        label = f"source file {path}"
        if actual == want:
            return _check(
                label,
                "pass",
                f"sha256 {actual[:16]}... is the one recorded at conversion",
                expected=want,
                actual=actual,
            )
        detail = f"sha256 {actual}, recorded at conversion {want}"
        return _check(label, "fail", detail, hint, expected=want, actual=actual)
    recorded = source.get("files") or []
    if not recorded:
        return _check(label, "skipped", "the manifest records no file list of this folder")
    changed, gone = [], []
    for entry in recorded:
        found = _find_source_file(where, source.get("format"), str(entry.get("path", "")))
        if found is None:
            gone.append(str(entry.get("path")))
        elif sha256_file(found) != entry.get("sha256"):
            changed.append(str(found))
    if changed:
        return _check(
            label,
            "fail",
            f"{len(changed)} of {len(recorded)} file(s) changed since conversion: "
            + ", ".join(changed[:3])
            + (" ..." if len(changed) > 3 else ""),
            hint,
        )
    if len(gone) == len(recorded):
        return _check(label, "skipped", "none of its recorded files is there any more")
    detail = f"{len(recorded) - len(gone)} file(s) have the sha256 recorded at conversion"
    if gone:
        detail += f"; {len(gone)} are gone ({', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''})"
    return _check(label, "pass", detail)


def _find_source_file(folder: Path, fmt: Any, rel: str) -> Path | None:
    """Where a recorded source file is now: its path is relative to ``folder`` or to the common
    folder of the format's source files (e.g. a Minari dataset's ``data/``)."""
    candidate = folder / rel
    if rel and candidate.is_file():
        return candidate
    try:
        import os

        from rlds_cli.formats import source_files

        files = source_files(str(fmt), [folder])
        base = Path(os.path.commonpath(files))
        base = base.parent if base.is_file() else base
    except Exception:  # an unknown format or an emptied folder: not found
        return None
    candidate = base / rel
    return candidate if rel and candidate.is_file() else None


def _dataset_checks(
    cache: CacheRoot, name: str, kind: str, legacy: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The cached dataset's own files: complete, and with the content recorded at write."""
    from rlds_cli.cache.digest import NOT_RECORDED, check_digests
    from rlds_cli.cache.opening import open_dataset

    manifest = cache.manifest(name)
    redo = _redo_hint(kind, manifest)
    try:
        dataset = open_dataset(name, cache)
    except CorruptDatasetError as exc:
        legacy.append(
            {
                "check": "cache files complete",
                "ok": False,
                "actual": exc.message,
                "expected": "every array file and chunk",
            }
        )
        return [_check("dataset opens", "fail", exc.message, redo)]
    files = _check_cache_files(dataset)
    legacy.append(files)
    what = {"view": "the parent's array files", "composed": "the parents' array files"}.get(
        kind, "every array file"
    )
    out = [
        _check(
            "files complete",
            "pass" if files["ok"] else "fail",
            f"{what} (each .npy, each zarr chunk) at its full size" if files["ok"] else files["actual"],
            redo,
        )
    ]
    if not files["ok"]:
        out.append(_check("content digests", "skipped", "files are missing or damaged"))
        return out
    report = check_digests(dataset)
    if not report.recorded and not report.checked and not report.problems:
        return [*out, _check("content digests", "skipped", NOT_RECORDED)]
    if not report.recorded:  # a view of a parent written by an older rlds
        out.append(_check("content digests of the parent's arrays", "skipped", NOT_RECORDED))
    for problem in report.problems:
        hint = redo
        owner = _owner(cache, problem.path)
        if owner is not None and owner != name:  # a parent's file (a view's, a merge's): remake that one
            hint = f"the file is {owner!r}'s, changed on disk: 'rlds verify {owner}' says how to remake it"
        out.append(
            _check(f"content digest of {problem.key}", "fail", f"{problem.path}: {problem.message}", hint)
        )
    if report.checked and not report.problems:
        arrays = [k for k in report.checked if k not in ("episodes", "source_arrays")]
        covered = [f"{len(arrays)} arrays{' of ' + report.scope if report.scope else ''}"] if arrays else []
        covered += ["the episode index"] if "episodes" in report.checked else []
        covered += [SOURCE_ARRAYS_FILE] if "source_arrays" in report.checked else []
        listed = " and ".join([", ".join(covered[:-1]), covered[-1]] if len(covered) > 1 else covered)
        out.append(
            _check("content digests", "pass", f"the digests of {listed} match those recorded at write")
        )
    return out


def _owner(cache: CacheRoot, path: Path) -> str | None:
    """The name of the cached dataset whose folder holds ``path`` (``None``: outside the cache)."""
    from rlds_cli.cache.manifest import read_manifest

    try:
        folder = cache.datasets_dir / Path(path).relative_to(cache.datasets_dir).parts[0]
    except (ValueError, IndexError):
        return None
    try:
        return read_manifest(folder).name
    except (OSError, CorruptDatasetError):  # its manifest is damaged too: its folder's name
        return folder.name


def _check_cache_files(dataset: Any) -> dict[str, Any]:
    """Every file of the cached dataset is there at its full size (no data is read)."""
    # a view's keys all fail alike when its parent is gone or replaced: one line says it
    problems = list(dict.fromkeys(dataset.check_files()))
    return {
        "check": "cache files complete",
        "ok": not problems,
        "actual": "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""),
        "expected": "every array file and chunk",
    }


def _raw_folder(
    cache: CacheRoot, name: str, entry: registry.RegistryEntry | None, manifest: Any
) -> Path | None:
    if manifest is not None and manifest.source.get("raw_dir"):
        return Path(manifest.source["raw_dir"])
    if entry is None and registry.is_known(name):
        entry = registry.resolve(name)
    return raw_dir(cache, entry.cache_name) if entry is not None and not entry.is_bundled else None


def _check_files(folder: Path, known: dict[str, str]) -> list[dict[str, Any]]:
    records = HashStore(folder).read()
    out = []
    for file_name in sorted(set(records) | set(known)):
        rec = records.get(file_name)
        expected = known.get(file_name) or (rec.sha256 if rec else None)
        path = folder / file_name
        row: dict[str, Any] = {"name": file_name, "expected": expected, "actual": None}
        row["origin"] = "registry" if file_name in known else (rec.origin if rec else None)
        if not path.is_file():
            row["status"] = "not kept" if rec is not None and rec.dropped else "gone"
        else:
            row["actual"] = sha256_file(path)
            clash = rec is not None and file_name in known and rec.sha256 != known[file_name]
            row["status"] = "ok" if row["actual"] == expected and not clash else "mismatch"
            if row["status"] == "ok" and file_name not in known and rec is not None and not rec.pinned:
                # a first-seen hash binds nothing until the file converted: it vouches for no byte
                row["status"] = "failed to convert" if rec.convert_failed else "unconfirmed"
        out.append(row)
    return out


def _check_manifest(manifest: Any, files: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's record of its source against the raw files (or their recorded hashes)."""
    source = manifest.source
    checks = []
    downloads = source.get("downloads", [])
    for d in downloads:
        f = files.get(d["name"])
        now = (f["actual"] or f["expected"]) if f else None
        checks.append(
            {
                "check": f"source file {d['name']}",
                "expected": d["sha256"],
                "actual": now,
                "ok": now is None or now == d["sha256"],
            }
        )
    if len(downloads) == 1:
        checks.append(
            {
                "check": "manifest source sha256",
                "expected": source.get("sha256"),
                "actual": downloads[0]["sha256"],
                "ok": source.get("sha256") == downloads[0]["sha256"],
            }
        )
    return checks
