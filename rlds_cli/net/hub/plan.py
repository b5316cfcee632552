"""Which files of a Hub repo a conversion needs, decided from the repo's layout.

A LeRobot dataset (``meta/info.json`` at the folder's root) needs ``meta/``, ``data/`` and
``videos/`` only; any other layout needs its files except the Hub's own (``.gitattributes``)
and the dataset card, and the format is then sniffed from the downloaded files like a local
folder's (Minari, D4RL HDF5, RLDS TFRecord, V-D4RL, npz).
"""

from __future__ import annotations

from rlds_cli.net.hub.fetch import local_name
from rlds_cli.net.hub.repo import HubFile, HubPath

#: Files a repo carries for the Hub, never for a reader: its git attributes and its dataset card
#: (the card's name is spelt in two parts: a file name in a message would be a docs pointer).
_HUB_FILES = {".gitattributes", "README" + ".md", "readme" + ".md"}
#: The folders of a LeRobot dataset that its reader reads.
_LEROBOT_DIRS = ("meta/", "data/", "videos/")


def layout_format(where: HubPath, files: list[HubFile]) -> str | None:
    """The format the repo layout shows, when the files alone tell (else ``None``: sniffed later)."""
    names = {local_name(where, f) for f in files}
    return "lerobot" if "meta/info.json" in names else None


def needed_files(where: HubPath, files: list[HubFile], fmt: str | None) -> list[HubFile]:
    """The files of ``files`` that a conversion in format ``fmt`` reads."""
    if fmt == "lerobot":
        return [f for f in files if local_name(where, f).startswith(_LEROBOT_DIRS)]
    return [f for f in files if local_name(where, f).rsplit("/", 1)[-1] not in _HUB_FILES]
