"""Dataset cards: licence, citation, robot type, fps and description, carried into derived data.

Kept in the manifest's ``card``.

A card is a JSON object, every field optional: ``license`` (an SPDX id, or a list for parents
under different licences), ``citation`` (e.g. BibTeX), ``robot_type``, ``fps``, ``description``
and ``license_from`` (``user``, ``registry``, ``lerobot``). A conversion stores the user's and the
source's (:func:`declared_card`); derived datasets combine their parents' (:func:`combine_cards`);
a view shows its parent's (:func:`dataset_card`).

Licences must be ids of :data:`SPDX`. :func:`license_conflicts` names licences that cannot
simply be used together in a mixture or merge:

* **non-commercial with commercial**: a source under a ``-NC`` licence and one that allows
  commercial use: the mix may be used non-commercially only;
* **two share-alike families**: ``CC-BY-SA``, ``CC-BY-NC-SA``, ``GPL``, ``ODbL``, ... each require
  derived work under their own terms, which exclude each other's;
* **no derivatives**: a ``-ND`` source may not be adapted (a mix is an adaptation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rlds_cli.errors import CacheError, UnknownLicenseError

#: Card fields, in the order cards show them.
FIELDS = ("license", "license_from", "license_conflicts", "citation", "robot_type", "fps", "description")


@dataclass(frozen=True)
class LicenseTerms:
    """What one licence allows: ``commercial`` use, adaptation (``derivatives``), and the
    share-alike ``family`` whose terms derived work must keep (``""``: none)."""

    commercial: bool = True
    derivatives: bool = True
    family: str = ""


_NC = LicenseTerms(commercial=False)
#: The SPDX ids rlds knows, with their terms (https://spdx.org/licenses/).
SPDX: dict[str, LicenseTerms] = {
    "CC0-1.0": LicenseTerms(),
    "PDDL-1.0": LicenseTerms(),
    "Unlicense": LicenseTerms(),
    "CC-BY-3.0": LicenseTerms(),
    "CC-BY-4.0": LicenseTerms(),
    "ODC-By-1.0": LicenseTerms(),
    "MIT": LicenseTerms(),
    "Apache-2.0": LicenseTerms(),
    "BSD-2-Clause": LicenseTerms(),
    "BSD-3-Clause": LicenseTerms(),
    "ISC": LicenseTerms(),
    "MPL-2.0": LicenseTerms(),
    "CDLA-Permissive-2.0": LicenseTerms(),
    "CDLA-Sharing-1.0": LicenseTerms(family="CDLA-Sharing"),
    "CC-BY-SA-3.0": LicenseTerms(family="CC-BY-SA"),
    "CC-BY-SA-4.0": LicenseTerms(family="CC-BY-SA"),
    "ODbL-1.0": LicenseTerms(family="ODbL"),
    "GPL-2.0-only": LicenseTerms(family="GPL-2.0"),
    "GPL-2.0-or-later": LicenseTerms(family="GPL"),
    "GPL-3.0-only": LicenseTerms(family="GPL"),
    "GPL-3.0-or-later": LicenseTerms(family="GPL"),
    "LGPL-3.0-only": LicenseTerms(family="LGPL"),
    "AGPL-3.0-only": LicenseTerms(family="AGPL"),
    "CC-BY-NC-3.0": _NC,
    "CC-BY-NC-4.0": _NC,
    "CC-BY-NC-SA-3.0": LicenseTerms(commercial=False, family="CC-BY-NC-SA"),
    "CC-BY-NC-SA-4.0": LicenseTerms(commercial=False, family="CC-BY-NC-SA"),
    "CC-BY-ND-4.0": LicenseTerms(derivatives=False),
    "CC-BY-NC-ND-4.0": LicenseTerms(commercial=False, derivatives=False),
}
_BY_LOWER = {k.lower(): k for k in SPDX}


def spdx_id(value: str) -> str:
    """``value`` as the SPDX id rlds knows, in its canonical case (``cc-by-4.0`` -> ``CC-BY-4.0``).

    Raises:
        UnknownLicenseError: ``value`` is no id of :data:`SPDX`.
    """
    known = _BY_LOWER.get(str(value).strip().lower())
    if known is None:
        raise UnknownLicenseError(f"licence {value!r} is no SPDX id rlds knows")
    return known


def known_spdx(value: Any) -> str | None:
    """``value`` as a known SPDX id, or ``None`` (a registry's ``unknown (...)`` text, ``None``)."""
    return _BY_LOWER.get(value.strip().lower()) if isinstance(value, str) else None


def make_card(
    *, license: str | None = None, citation: str | None = None, from_: str = "user"
) -> dict[str, Any]:
    """The card a user gives (``--license``, ``--citation``), the licence checked.

    Raises:
        UnknownLicenseError: ``license`` is no known SPDX id.
    """
    card: dict[str, Any] = {}
    if license is not None:
        card["license"], card["license_from"] = spdx_id(license), from_
    if citation:
        card["citation"] = str(citation)
    return card


def declared_card(metadata: dict[str, Any], registry_license: str | None = None) -> dict[str, Any]:
    """The card a source declares: LeRobot's ``meta/info.json`` (``license``, ``robot_type``,
    ``fps``), Minari's ``metadata.json`` (``description``), else the registry's known licence."""
    card: dict[str, Any] = {}
    lerobot = metadata.get("lerobot") if isinstance(metadata, dict) else None
    if isinstance(lerobot, dict):
        if known_spdx(lerobot.get("license")):
            card["license"], card["license_from"] = known_spdx(lerobot["license"]), "lerobot"
        if lerobot.get("robot_type"):
            card["robot_type"] = str(lerobot["robot_type"])
        if valid_fps(lerobot.get("fps")) is not None:
            card["fps"] = lerobot["fps"]
    minari = metadata.get("minari") if isinstance(metadata, dict) else None
    if isinstance(minari, dict) and isinstance(minari.get("description"), str):
        card["description"] = minari["description"]
    if "license" not in card and known_spdx(registry_license):
        card["license"], card["license_from"] = known_spdx(registry_license), "registry"
    return card


def with_user(declared: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``declared`` with what the user gave on top (their ``--license`` wins)."""
    return {k: v for k, v in {**declared, **given}.items() if k in FIELDS and v not in (None, "")}


def licenses_of(card: dict[str, Any]) -> list[str]:
    """The licence ids of a card (a list for a card made of several)."""
    value = card.get("license")
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)] if value else []


def combine_cards(
    cards: list[dict[str, Any]], names: list[str] | None = None, description: str | None = None
) -> dict[str, Any]:
    """The card of a dataset made of parents with ``cards``: fields kept where all agree,
    differing licences listed (``"unknown"`` added where a parent declares none), distinct
    citations joined; ``license_conflicts`` filled when ``names`` are given."""
    out: dict[str, Any] = {}
    if names is not None:
        # a parent's own conflicts name its sources (a view of a merge: recomputed from the merge's
        # licences, they named the merge on both sides); across parents, each licence's parent
        carried = [str(c) for card in cards for c in card.get("license_conflicts") or []]
        pairs = [(n, lic) for n, card in zip(names, cards, strict=True) for lic in licenses_of(card)]
        across = license_conflicts(pairs) if len(cards) > 1 else []
        conflicts = list(dict.fromkeys([*carried, *across]))
        if conflicts:
            out["license_conflicts"] = conflicts
    licenses = sorted({lic for card in cards for lic in licenses_of(card)})
    if licenses and all(licenses_of(card) for card in cards):
        out["license"] = licenses[0] if len(licenses) == 1 else licenses
        froms = {card.get("license_from") for card in cards}
        if len(froms) == 1 and None not in froms:
            out["license_from"] = froms.pop()
    elif licenses:  # some parents declare none: the whole is not known
        out["license"] = [*licenses, "unknown"]
    citations = list(dict.fromkeys(str(c["citation"]) for c in cards if c.get("citation")))
    if citations:
        out["citation"] = "\n\n".join(citations)
    robot_types = {repr(card.get("robot_type")) for card in cards}
    if len(robot_types) == 1 and cards and cards[0].get("robot_type") is not None:
        out["robot_type"] = cards[0]["robot_type"]
    rates = {valid_fps(card.get("fps")) for card in cards}
    if len(rates) == 1 and cards and cards[0].get("fps") is not None:
        out["fps"] = cards[0]["fps"]
    elif any("fps" in card for card in cards):  # (a merge of mixed rates has "fps": null)
        out["fps"] = None  # parents of different rates, or some of none: its steps have no one rate
    if description is not None:
        out["description"] = description
    elif len(cards) == 1 and cards[0].get("description"):
        out["description"] = cards[0]["description"]
    return out


def license_conflicts(licenses: Iterable[tuple[str, str]]) -> list[str]:
    """Why sources ``(name, SPDX id)`` cannot simply be used together, one sentence each (empty:
    none known; ids outside :data:`SPDX` are ignored)."""
    known = [(name, lic, SPDX[lic]) for name, lic in licenses if lic in SPDX]
    problems: list[str] = []
    non_commercial = [(n, lic) for n, lic, t in known if not t.commercial]
    commercial = [(n, lic) for n, lic, t in known if t.commercial]
    if non_commercial and commercial:
        problems.append(
            f"{_names(non_commercial)} may not be used commercially, {_names(commercial)} may: the mix may "
            "be used non-commercially only"
        )
    families: dict[str, list[tuple[str, str]]] = {}
    for n, lic, t in known:
        if t.family:
            families.setdefault(t.family, []).append((n, lic))
    if len(families) > 1:
        parts = " and ".join(_names(v) for v in families.values())
        problems.append(f"{parts} require derived work under share-alike terms that exclude each other")
    no_derivatives = [(n, lic) for n, lic, t in known if not t.derivatives]
    if no_derivatives and len(known) > 1:
        problems.append(f"{_names(no_derivatives)} may not be adapted, and a mix is an adaptation")
    return problems


def _names(pairs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{n} ({lic})" for n, lic in pairs)


def dataset_card(ds: Any) -> dict[str, Any]:
    """A dataset's card: its manifest's own, else a view's parent's (``{}`` when the parent is
    gone or replaced)."""
    own = dict(ds.manifest.card)
    if own:
        return own
    try:
        parent = ds.view_parent()
    except CacheError:
        return {}
    return dataset_card(parent[0]) if parent is not None else {}


def valid_fps(value: Any) -> float | None:
    """``value`` as a frame rate: a positive finite number (not a bool), else ``None``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def dataset_fps(ds: Any) -> float | None:
    """The rate a dataset's steps run at, in steps a second: its card's ``fps`` (carried through
    views, merges and trims, divided by downsampling; ``null`` for a merge of parents of different
    rates, or of some without one), else, for a card without ``fps``, its source's LeRobot
    ``fps``; ``None`` when there is no valid rate."""
    card = dataset_card(ds)
    if "fps" in card:
        return valid_fps(card["fps"])
    lerobot = ds.source_metadata.get("lerobot")
    return valid_fps(lerobot.get("fps")) if isinstance(lerobot, dict) else None
