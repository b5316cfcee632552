"""TOML pieces every registry family generator writes the same way (see scripts/gen_registry.py)."""

from __future__ import annotations

UNKNOWN_HASH = "# sha256 and size: not published anywhere; recorded on first download, verified after"


def q(value: str) -> str:
    """A TOML basic string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_list(values: list[str]) -> str:
    """A TOML array of basic strings."""
    return "[" + ", ".join(q(v) for v in values) + "]"


def entry(
    dataset_id: str,
    fmt: str,
    files: list[tuple[str, list[str]]],
    *,
    aliases: list[str] | tuple[str, ...] = (),
    fields: dict[str, object] | None = None,
    listing: dict[str, str] | None = None,
    published: dict[str, object] | None = None,
) -> str:
    """One ``[[dataset]]`` table with its listing, published figures and files."""
    lines = ["[[dataset]]", f"id = {q(dataset_id)}"]
    if aliases:
        lines.append(f"aliases = {toml_list(list(aliases))}")
    lines.append(f"format = {q(fmt)}")
    for key, value in (fields or {}).items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, float):  # repr is a valid TOML float (12135.0, -0.8503839912088142)
            lines.append(f"{key} = {value!r}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        elif isinstance(value, dict):
            inner = ", ".join(f"{k} = {q(str(v))}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        else:
            lines.append(f"{key} = {q(str(value))}")
    if listing:
        lines.append("")
        lines.append("[dataset.listing]")
        lines.extend(f"{k} = {q(v)}" for k, v in listing.items())
    if published:
        lines += ["", "[dataset.published]", "# rounded figures an upstream publishes: shown, never checked"]
        lines.extend(f"{k} = {v if isinstance(v, int) else q(str(v))}" for k, v in published.items())
    for name, urls in files:
        lines += ["", "[[dataset.files]]", UNKNOWN_HASH, f"name = {q(name)}", f"urls = {toml_list(urls)}"]
    return "\n".join(lines) + "\n"
