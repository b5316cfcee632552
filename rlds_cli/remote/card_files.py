"""The files that describe a dataset pushed to the Hugging Face Hub: ``README.md`` (the dataset
card, YAML front matter then text) and ``croissant.json`` (Croissant 1.0 JSON-LD metadata).

The front matter holds what the Hub reads (``license``, ``tags``, ``pretty_name``,
``size_categories``) and what rlds knows besides: ``robot_type``, ``fps``, ``citation``,
``lineage`` (the datasets it was made of, each with its manifest digest) and ``statistics``
(steps, episodes, keys). Values are written as JSON scalars and flow lists, which YAML reads as
they are, so no YAML library is needed. The Croissant file describes the dataset and its files
(``distribution``: one ``cr:FileObject`` per file pushed, with its sha256); it has no
``recordSet``, since Croissant's extractors read CSV, JSON and Parquet, not ``.npy`` arrays.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlds_cli.cache.card import licenses_of
from rlds_cli.cache.manifest import Manifest

#: The files this module writes, by name.
README_FILE = "README.md"
CROISSANT_FILE = "croissant.json"

#: The JSON-LD context of Croissant 1.0: the one its reference implementation, mlcroissant, writes
#: and expects (``mlcroissant/_src/core/rdf.py``; another context only draws a warning).
CROISSANT_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}


def _size_category(steps: int) -> str:
    """The Hub's ``size_categories`` bucket of a number of rows."""
    for limit, label in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
    ):
        if steps < limit:
            return label
    return "1M<n<10M" if steps < 10_000_000 else "10M<n<100M" if steps < 100_000_000 else "n>1T"


def front_matter(manifest: Manifest, card: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML front matter, as a mapping of JSON values."""
    licenses = licenses_of(card)
    meta: dict[str, Any] = {
        "license": licenses[0].lower()
        if len(licenses) == 1
        else [lic.lower() for lic in licenses] or "unknown",
        "pretty_name": manifest.name,
        "tags": [
            "rlds",
            "offline-rl",
            "reinforcement-learning",
            *(["robotics"] if card.get("robot_type") else []),
        ],
        "size_categories": [_size_category(manifest.num_steps)],
    }
    for key in ("robot_type", "fps", "citation"):
        if card.get(key) is not None:
            meta[key] = card[key]
    if manifest.lineage:
        meta["lineage"] = [
            {"name": p.get("name"), "digest": p.get("digest"), "op": p.get("op", "derived")}
            for p in manifest.lineage
        ]
    meta["statistics"] = {
        "num_steps": manifest.num_steps,
        "num_episodes": manifest.num_episodes,
        "keys": {k: {"shape": list(s.shape), "dtype": s.dtype} for k, s in manifest.fields.items()},
    }
    return meta


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """``value`` (a mapping) as block YAML whose scalars and lists are JSON (valid YAML)."""
    pad = "  " * indent
    lines: list[str] = []
    for key, item in value.items():
        if isinstance(item, dict):
            lines.append(f"{pad}{key}:")
            lines += _yaml(item, indent + 1)
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            lines.append(f"{pad}{key}:")
            for entry in item:
                inner = _yaml(entry, indent + 2)
                lines.append(f"{pad}  - {inner[0].strip()}")
                lines += inner[1:]
        else:
            lines.append(f"{pad}{key}: {_yaml_safe(json.dumps(item, ensure_ascii=False))}")
    return lines


#: Characters JSON keeps raw that a YAML reader refuses (DEL, C1 controls: "special characters are
#: not allowed") or reads as a line break or a byte-order mark; only ever inside a JSON string here.
_NOT_YAML = re.compile("[\x7f-\x9f\u2028\u2029\ufeff]")


def _yaml_safe(text: str) -> str:
    """JSON ``text`` with those characters written as ``\\uXXXX`` escapes (the same string)."""
    return _NOT_YAML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def readme(manifest: Manifest, card: dict[str, Any]) -> str:
    """The dataset card: front matter, then what the dataset is and how to read it."""
    meta = front_matter(manifest, card)
    licenses = ", ".join(licenses_of(card)) or "not declared"
    parts = [
        "---",
        *_yaml(meta),
        "---",
        "",
        f"# {manifest.name}",
        "",
        str(
            card.get("description")
            or f"An offline-RL dataset of {manifest.num_episodes:,} episodes "
            f"({manifest.num_steps:,} steps), pushed by rlds."
        ),
        "",
        f"- **License:** {licenses}",
        *([f"- **Robot type:** {card['robot_type']}"] if card.get("robot_type") else []),
        *([f"- **Frames per second:** {card['fps']}"] if card.get("fps") is not None else []),
        "",
        "Read it with rlds: `rlds pull hf://datasets/ORG/REPO NAME`, or in place with "
        '`rlds_cli.open_dataset("hf://datasets/ORG/REPO")`.',
    ]
    if card.get("citation"):
        parts += ["", "## Citation", "", "```", str(card["citation"]), "```"]
    return "\n".join(parts) + "\n"


def croissant(
    manifest: Manifest, card: dict[str, Any], files: dict[str, tuple[int, str]], url: str
) -> dict[str, Any]:
    """The Croissant 1.0 JSON-LD of a pushed dataset: ``files`` maps each pushed file's path to
    its size and sha256; ``url`` is where the dataset lies."""
    licenses = licenses_of(card)
    doc: dict[str, Any] = {
        "@context": CROISSANT_CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": "http://mlcommons.org/croissant/1.0",
        "name": manifest.name,
        "description": str(
            card.get("description") or f"{manifest.num_episodes} episodes, {manifest.num_steps} steps"
        ),
        "url": url,
        "license": [f"https://spdx.org/licenses/{lic}.html" for lic in licenses] if licenses else "unknown",
        "datePublished": manifest.created_at,
        "version": "1.0.0",
        "distribution": [
            {
                "@type": "cr:FileObject",
                "@id": path,
                "name": path,
                "contentUrl": path,
                "contentSize": f"{size} B",
                "encodingFormat": "application/json"
                if path.endswith(".json")
                else "application/octet-stream",
                "sha256": sha256,
            }
            for path, (size, sha256) in sorted(files.items())
        ],
    }
    if card.get("citation"):
        doc["citeAs"] = str(card["citation"])
    return doc


def card_files(
    manifest: Manifest, card: dict[str, Any], files: dict[str, tuple[int, str]], url: str
) -> dict[str, bytes]:
    """``README.md`` and ``croissant.json`` of a pushed dataset, as bytes."""
    return {
        README_FILE: readme(manifest, card).encode(),
        CROISSANT_FILE: (json.dumps(croissant(manifest, card, files, url), indent=2) + "\n").encode(),
    }
