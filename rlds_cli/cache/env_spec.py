"""The environment a dataset was recorded in: its stored form, reading it, and remaking it.

:meth:`Dataset.recover_environment() <rlds_cli.cache.dataset.Dataset.recover_environment>` makes
it again with gymnasium.

The manifest's top-level ``env`` object (:func:`env_entry` makes it from a gymnasium
``EnvSpec``; ``eval_spec``, ``requirements`` and ``source`` optional)::

    "env": {"spec": {...gymnasium EnvSpec.to_json()...}, "eval_spec": {...}, "origin": "...",
            "requirements": ["mujoco>=3"], "source": "registry"}

A D4RL registry download stores the ``d4rl`` package's id (old ``gym`` API) and
``max_episode_steps`` there (:meth:`RegistryEntry.env_entry
<rlds_cli.catalog.registry.RegistryEntry.env_entry>`, ``"source": "registry"``).

:func:`read_env_spec` looks, in order, at:

1. the manifest's ``env``;
2. for ``source.format`` ``rlds-writer``: ``source.metadata.spaces.env_spec`` (from
   ``DatasetWriter(env_spec=...)``);
3. a Minari source's ``env_spec`` and ``eval_env_spec`` under ``source.metadata.spaces`` (with
   ``requirements`` under ``source.metadata.minari``).

A view has its parent's environment; ``rlds preprocess`` output has none. D4RL downloads without
``env`` get it by downloading again with ``--force``. gymnasium is imported only to make or
serialize an environment, never to read a spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlds_cli.cache.layout import VIEW_LAYOUT
from rlds_cli.cache.manifest import Manifest, read_manifest
from rlds_cli.cache.views import ViewSpec
from rlds_cli.errors import (
    GYMNASIUM_INSTALL,
    EnvironmentUnavailableError,
    MissingExtraError,
    NoEnvSpecError,
    RldsError,
)

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset

__all__ = [
    "RecordedEnvSpec",
    "dataset_env_spec",
    "env_entry",
    "env_spec_to_json",
    "own_manifest",
    "read_env_spec",
    "recover_environment",
]

#: Spec keys gymnasium 1.x does not have; dropped as Minari's ``MinariDataset.__init__`` does.
_RETIRED_KEYS = ("order_enforce", "apply_api_compatibility", "autoreset")


@dataclass(frozen=True)
class RecordedEnvSpec:
    """The environment a dataset records, as stored (no gymnasium needed to read it).

    Attributes:
        id: The gymnasium environment id (``"Pendulum-v1"``, ``"D4RL/door-v2"``).
        kwargs: Keyword arguments the environment was made with.
        max_episode_steps: The time limit, when known.
        entry_point: ``"module:Class"`` of the environment, when the spec names it.
        raw: The spec's JSON object as stored (gymnasium's ``EnvSpec.to_json()`` for a full spec;
            only ``id`` and ``max_episode_steps`` for one taken from the registry).
        origin: Where it came from, in words (``rlds inspect`` shows it).
        source: The same, as a word: ``"manifest"``, ``"minari"`` or ``"registry"``.
        eval_raw: The spec of the environment meant for evaluation, when the source has one.
        requirements: Packages the environment needs (Minari's ``requirements``), e.g.
            ``("mujoco>=2.3.7",)``.
    """

    id: str
    kwargs: dict[str, Any]
    max_episode_steps: int | None
    entry_point: str | None
    raw: dict[str, Any]
    origin: str
    source: str
    eval_raw: dict[str, Any] | None = None
    requirements: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``rlds inspect --json`` prints."""
        return {
            "id": self.id,
            "kwargs": self.kwargs,
            "max_episode_steps": self.max_episode_steps,
            "entry_point": self.entry_point,
            "origin": self.origin,
            "source": self.source,
            "has_eval_spec": self.eval_raw is not None,
            "requirements": list(self.requirements),
            "spec": self.raw,
        }


def _record(
    raw: Any, eval_raw: Any, origin: str, source: str, requirements: Any = ()
) -> RecordedEnvSpec | None:
    """A :class:`RecordedEnvSpec` from a stored JSON object or string, or ``None`` without an
    environment id."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
        return None
    if isinstance(eval_raw, str):
        try:
            eval_raw = json.loads(eval_raw)
        except ValueError:
            eval_raw = None
    steps = raw.get("max_episode_steps")
    entry = raw.get("entry_point")
    kwargs = raw.get("kwargs")
    reqs = tuple(str(r) for r in requirements) if isinstance(requirements, list | tuple) else ()
    return RecordedEnvSpec(
        id=raw["id"],
        kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
        max_episode_steps=steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
        entry_point=entry if isinstance(entry, str) else None,
        raw=raw,
        origin=origin,
        source=source,
        eval_raw=eval_raw if isinstance(eval_raw, dict) else None,
        requirements=reqs,
    )


def read_env_spec(manifest: Manifest) -> RecordedEnvSpec | None:
    """The environment ``manifest`` records (lookup order: module docstring), or ``None``; for a
    view use :func:`dataset_env_spec`."""
    env = manifest.env
    if env:
        origin = env.get("origin") if isinstance(env.get("origin"), str) else "recorded by the writer"
        source = "registry" if env.get("source") == "registry" else "manifest"
        found = _record(env.get("spec"), env.get("eval_spec"), f"manifest env ({origin})", source,
                        env.get("requirements", ()))  # fmt: skip
        if found is not None:
            return found
    metadata = manifest.source.get("metadata")
    if isinstance(metadata, dict):
        spaces = metadata.get("spaces")
        if (
            isinstance(spaces, dict)
            and spaces.get("env_spec")
            and manifest.source.get("format") == "rlds-writer"
        ):
            # DatasetWriter(env_spec=...) keeps it there, with or without the spaces of a recording
            origin = "the writer's env_spec (manifest source.metadata.spaces)"
            found = _record(spaces.get("env_spec"), spaces.get("eval_env_spec"), origin, "manifest", ())
            if found is not None:
                return found
        if isinstance(spaces, dict) and spaces.get("serializer") == "minari" and spaces.get("env_spec"):
            minari = metadata.get("minari")
            requirements = minari.get("requirements", ()) if isinstance(minari, dict) else ()
            found = _record(spaces.get("env_spec"), spaces.get("eval_env_spec"),
                            "Minari metadata.json env_spec (manifest source.metadata.spaces)", "minari",
                            requirements)  # fmt: skip
            if found is not None:
                return found
    return None


def own_manifest(dataset: Dataset) -> Manifest | None:
    """The manifest describing ``dataset``'s environment and scores: its own, or a view's
    parent's (``None`` when the parent is gone or replaced)."""
    manifest = dataset.manifest
    if manifest.layout != VIEW_LAYOUT:
        return manifest
    view = ViewSpec.from_manifest(manifest)
    try:
        parent = read_manifest(dataset.directory.parent / view.parent.replace("/", "--"))
    except (OSError, ValueError, RldsError):
        return None
    return parent if parent.digest() == view.parent_digest else None


def dataset_env_spec(dataset: Dataset) -> RecordedEnvSpec | None:
    """:func:`read_env_spec` of a dataset (of the parent for a view: :func:`own_manifest`)."""
    manifest = own_manifest(dataset)
    return read_env_spec(manifest) if manifest is not None else None


# ----------------------------------------------------------------------------- gymnasium side


def _gymnasium(what: str) -> Any:
    try:
        import gymnasium
    except ImportError:
        raise MissingExtraError(
            f"{what} needs gymnasium, which is not installed: {GYMNASIUM_INSTALL}", hint=GYMNASIUM_INSTALL
        ) from None
    return gymnasium


def env_spec_to_json(spec: Any) -> dict[str, Any]:
    """A gymnasium ``EnvSpec`` as the manifest stores it (``EnvSpec.to_json()``, decoded).

    Raises:
        EnvironmentUnavailableError: The spec cannot be written as JSON (an entry point or a
            keyword argument that is a Python object, not text or numbers).
    """
    try:
        return dict(json.loads(spec.to_json()))
    except (ValueError, TypeError) as exc:
        raise EnvironmentUnavailableError(
            f"the spec of environment {getattr(spec, 'id', spec)!r} cannot be stored as JSON: {exc}",
            hint="register the environment with a 'module:Class' entry point and JSON-compatible kwargs",
        ) from exc


def env_entry(spec: Any, eval_spec: Any = None, *, origin: str = "recorded by rlds") -> dict[str, Any]:
    """The manifest's ``env`` value for a gymnasium ``EnvSpec`` and optional evaluation spec."""
    entry: dict[str, Any] = {"spec": env_spec_to_json(spec), "origin": origin}
    if eval_spec is not None:
        entry["eval_spec"] = env_spec_to_json(eval_spec)
    return entry


def _to_gymnasium(gym: Any, raw: dict[str, Any], name: str) -> Any:
    """gymnasium's ``EnvSpec`` of a stored full spec, :data:`_RETIRED_KEYS` unknown to it
    dropped."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(gym.envs.registration.EnvSpec)}
    data = {k: v for k, v in raw.items() if k in known or k not in _RETIRED_KEYS}
    data.setdefault("additional_wrappers", [])
    try:
        return gym.envs.registration.EnvSpec.from_json(json.dumps(data))
    except (ValueError, TypeError) as exc:
        raise EnvironmentUnavailableError(
            f"the env spec of dataset {name!r} cannot be read by this gymnasium "
            f"({gym.__version__}): {str(exc)[:200]}",
            hint="install the gymnasium version the dataset was recorded with",
        ) from exc


def _missing_hint(spec: RecordedEnvSpec, fallback: str) -> str:
    if spec.requirements:
        return "install what the dataset lists: pip install " + " ".join(repr(r) for r in spec.requirements)
    return fallback


def _no_env_hint(dataset: Dataset) -> str | None:
    """The hint for a D4RL download without a recorded environment, else ``None``."""
    manifest = own_manifest(dataset)
    source = manifest.source if manifest is not None else {}
    if source.get("format") == "d4rl" and isinstance(source.get("id"), str):
        return (
            f"a D4RL registry download made before 2026-11-27 records none: 'rlds download "
            f"{source['id']} --force' records the environment its registry entry names, if any"
        )
    return None  # the error's default hint


def recover_environment(dataset: Dataset, eval_env: bool = False, **kwargs: Any) -> Any:
    """Make the environment ``dataset`` was recorded in
    (:meth:`~rlds_cli.cache.dataset.Dataset.recover_environment`).

    As Minari does: ``gymnasium.make(spec, **kwargs)`` of the stored spec (the evaluation spec
    with ``eval_env=True``, when there is one); an id-only spec is made as
    ``gymnasium.make(id, max_episode_steps=..., **kwargs)``.

    Raises:
        NoEnvSpecError: The dataset records no environment.
        MissingExtraError: gymnasium, or a package the environment needs (mujoco, ...), is not
            installed; the hint names it.
        EnvironmentUnavailableError: The id is not registered with gymnasium here, or the spec
            cannot be read by the installed gymnasium.
    """
    spec = dataset_env_spec(dataset)
    name = dataset.name
    if spec is None:
        raise NoEnvSpecError(
            f"dataset {name!r} records no environment to recover", hint=_no_env_hint(dataset)
        )
    gym = _gymnasium(f"recovering the environment of dataset {name!r}")
    raw = spec.eval_raw if eval_env and spec.eval_raw is not None else spec.raw
    env_id = str(raw.get("id", spec.id))
    for wrapper in raw.get("additional_wrappers") or ():
        if isinstance(wrapper, dict) and wrapper.get("kwargs") is None:  # gymnasium cannot remake it
            raise EnvironmentUnavailableError(
                f"environment {env_id!r} of dataset {name!r} was recorded inside the wrapper "
                f"{wrapper.get('name')!r}, whose arguments gymnasium did not record (it does not "
                "inherit gymnasium.utils.RecordConstructorArgs)",
                hint=f"make the environment yourself: gymnasium.make({env_id!r}), then wrap it as it was",
            )
    try:
        if isinstance(raw.get("entry_point"), str):
            return gym.make(_to_gymnasium(gym, raw, name), **kwargs)
        args = {"max_episode_steps": raw["max_episode_steps"]} if raw.get("max_episode_steps") else {}
        return gym.make(env_id, **{**args, **kwargs})
    except gym.error.DependencyNotInstalled as exc:
        raise MissingExtraError(
            f"environment {env_id!r} of dataset {name!r} cannot be made: {exc}",
            hint=_missing_hint(spec, "install the package gymnasium names above"),
        ) from None
    except ModuleNotFoundError as exc:
        raise MissingExtraError(
            f"environment {env_id!r} of dataset {name!r} needs the module {exc.name!r}, "
            "which is not installed",
            hint=_missing_hint(spec, f"install the package that provides {exc.name!r}"),
        ) from None
    except gym.error.UnregisteredEnv:
        d4rl = spec.source == "registry" and "d4rl" in spec.origin
        hint = (
            "D4RL registers its environments in the d4rl package, for the old gym API; evaluate in "
            "the matching gymnasium environment, or use the dataset's Minari version"
            if d4rl
            else _missing_hint(spec, "import the package that registers it before recovering the environment")
        )
        raise EnvironmentUnavailableError(
            f"environment {env_id!r} of dataset {name!r} is not registered with gymnasium", hint=hint
        ) from None
