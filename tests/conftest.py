"""Shared test set-up: every test gets its own cache root, sees no ``RLDS_*`` setting of the shell
that started pytest, and never reaches the network.

* ``RLDS_*`` variables are removed for the whole session (so module fixtures such as the local
  Ray instance start clean) and again at the start of each test; a test that needs one sets it
  with ``monkeypatch.setenv`` (``isolated_cache`` sets ``RLDS_HOME`` and ``RLDS_FSYNC=0``).
* Sockets of this process may only reach loopback (``127.0.0.0/8``, ``::1``, ``localhost``; Unix
  sockets are not concerned): ``socket.getaddrinfo`` refuses any other host name with
  :class:`NameLookupBlockedError` (a ``socket.gaierror``, so code under test sees an unresolvable
  name and fails at once), ``socket.socket.connect`` refuses any other address with
  :class:`NetworkBlockedError` (``ENETUNREACH``) and ``connect_ex`` returns ``ENETUNREACH``, as on a
  machine without a network. ``socket.create_connection`` and ``requests`` go through these.
  Tests that fake DNS failures wrap ``socket.getaddrinfo`` themselves and call this guarded one
  for other hosts. Subprocesses (CLI runs, torchrun, Ray workers) are not covered: they are
  started with loopback addresses.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.d4rl_fixtures import GoldenFactory
    from tests.http_faults import FaultServer
    from tests.hub_standin import HubStandin
    from tests.loader_fixtures import TedFactory

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_INET = (socket.AF_INET, socket.AF_INET6)


class NetworkBlockedError(OSError):
    """A connection to an address other than loopback, refused by ``tests/conftest.py``."""


class NameLookupBlockedError(socket.gaierror):
    """A host-name lookup other than loopback, refused by ``tests/conftest.py``."""


def is_local_host(host: Any) -> bool:
    """Whether ``host`` (a name or an address, as given to ``getaddrinfo`` or ``connect``) is this
    machine: loopback, ``localhost``, or the unspecified address (``None``, ``""``, ``0.0.0.0``)."""
    if host is None:
        return True
    if isinstance(host, bytes | bytearray):
        host = bytes(host).decode("ascii", "replace")
    name = str(host).strip().strip("[]").lower().rstrip(".")
    if not name or name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])  # fe80::1%lo: the zone is no part of it
    except ValueError:
        return False  # any other name
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def _is_address(host: Any) -> bool:
    """Whether ``host`` is a numeric IP address (``getaddrinfo`` needs no DNS for it)."""
    if isinstance(host, bytes | bytearray):
        host = bytes(host).decode("ascii", "replace")
    try:
        ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    return True


def _inet_host(sock: socket.socket, address: Any) -> Any:
    """The host of an AF_INET/AF_INET6 ``address``; ``None`` for other families (Unix sockets...)."""
    if sock.family in _INET and isinstance(address, tuple) and address:
        return address[0]
    return None


_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not is_local_host(host) and not _is_address(host):  # an address: connect() decides
        raise NameLookupBlockedError(
            socket.EAI_NONAME, f"tests/conftest.py blocks the network: no lookup of {host!r}"
        )
    return _real_getaddrinfo(host, *args, **kwargs)


def _guarded_connect(self: socket.socket, address: Any) -> None:
    host = _inet_host(self, address)
    if host is not None and not is_local_host(host):
        raise NetworkBlockedError(
            errno.ENETUNREACH, f"tests/conftest.py blocks the network: no connection to {address!r}"
        )
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    host = _inet_host(self, address)
    if host is not None and not is_local_host(host):
        return errno.ENETUNREACH
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def hermetic_session() -> Iterator[None]:
    """For the whole session: no ``RLDS_*`` variable, and sockets limited to loopback."""
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("RLDS_")]:
            mp.delenv(var)
        mp.setattr(socket, "getaddrinfo", _guarded_getaddrinfo)
        mp.setattr(socket.socket, "connect", _guarded_connect)
        mp.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
        yield


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Unset every ``RLDS_*`` variable (a module fixture or another test may have left one), point
    the cache at a fresh temp dir, and skip fsync (tests that need it turn it on)."""
    for var in [v for v in os.environ if v.startswith("RLDS_")]:
        monkeypatch.delenv(var)
    root = tmp_path / "rlds-home"
    monkeypatch.setenv("RLDS_HOME", str(root))
    monkeypatch.setenv("RLDS_FSYNC", "0")
    return root


@pytest.fixture
def consoles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed widths for the CLI's consoles, whatever the terminal (xdist workers get COLUMNS=80):
    250 columns for stdout and stderr, or what the test's ``console_widths(out, err)`` marker
    says. A module turns it on with ``pytestmark = pytest.mark.usefixtures("consoles")``."""
    from rich.console import Console

    from rlds_cli.cli import output

    marker = request.node.get_closest_marker("console_widths")
    out, err = marker.args if marker is not None else (250, 250)
    monkeypatch.setattr(output, "console", Console(highlight=False, width=out))
    monkeypatch.setattr(output, "err_console", Console(stderr=True, highlight=False, width=err))


@pytest.fixture
def golden_file(tmp_path: Path) -> Path:
    """The golden 3-episode D4RL file without next_observations (``tests/d4rl_fixtures.py``,
    expected conversion: ``GOLDEN_NO_NEXT``)."""
    from tests.d4rl_fixtures import golden_three_episodes

    return golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)


@pytest.fixture
def golden_next_file(tmp_path: Path) -> Path:
    """The golden file with next_observations (expected conversion: ``GOLDEN_NEXT``)."""
    from tests.d4rl_fixtures import golden_three_episodes

    return golden_three_episodes(tmp_path / "golden-next.hdf5", with_next=True)


@pytest.fixture
def golden_dataset(tmp_path: Path) -> GoldenFactory:
    """The golden file converted into the test's cache (``d4rl_fixtures.GoldenFactory``; expected
    values: ``GOLDEN_NEXT`` / ``GOLDEN_NO_NEXT``); the conversion ran, was not reused."""
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.sources.convert import convert
    from tests.d4rl_fixtures import golden_three_episodes

    def make(name: str = "golden", *, with_next: bool = False, backend: str | None = None) -> Any:
        file = tmp_path / f"{name.replace('/', '-')}-source.hdf5"  # beside golden_file's golden.hdf5
        source = golden_three_episodes(file, with_next=with_next)
        assert convert(source, name, backend=backend).reused is False
        return open_dataset(name)

    return make


@pytest.fixture(scope="session")
def ted_dataset(tmp_path_factory: pytest.TempPathFactory) -> TedFactory:
    """The tests' dataset factory (``loader_fixtures.TedFactory``): ``build(root, name, lengths,
    backend)`` with fsync off, in ``root`` (made if missing) or a fresh temp folder. Session-scoped,
    so a module fixture builds once."""
    from tests.loader_fixtures import make_ted

    def make(
        lengths: list[int],
        name: str = "ted",
        *,
        backend: str = "memmap",
        root: Path | None = None,
        build: Callable[..., Any] = make_ted,
    ) -> Any:
        folder = tmp_path_factory.mktemp(name) if root is None else root
        folder.mkdir(parents=True, exist_ok=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RLDS_FSYNC", "0")
            return build(folder, name, list(lengths), backend)

    return make


@pytest.fixture(scope="module")
def robots(ted_dataset: TedFactory) -> dict[str, Any]:
    """The mixture tests' robots (``mixture_fixtures.ROBOTS``), built once per module: franka
    (7-dim actions, 8-dim proprio), widowx (8, 9), aloha (14, 8)."""
    from tests.mixture_fixtures import ROBOTS, robot_builder

    return {
        name: ted_dataset(lengths, name, build=robot_builder(act, obs, seed))
        for name, (act, obs, lengths, seed) in ROBOTS.items()
    }


# ----------------------------------------------------------------------------- HTTP client tests


@pytest.fixture
def sleeps() -> list[float]:
    """The back-off delays a download asked for (recorded, never slept)."""
    return []


@pytest.fixture
def config(sleeps: list[float]) -> Any:
    """An ``HttpConfig``: tiny timeouts, four retries, no real sleeping (the delays asked for go
    to ``sleeps``)."""
    from rlds_cli.net.http import HttpConfig

    return HttpConfig(timeout=(2.0, 2.0), retries=4, base_delay=0.01, sleep=sleeps.append)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    """A :class:`tests.http_faults.FaultServer` on 127.0.0.1 serving ``http_faults.DATA`` at
    ``http_faults.PATH``. A download module's own ``server`` adds its files and settings over it
    (``http_faults.serving``)."""
    from tests.http_faults import DATA, PATH, FaultServer

    with FaultServer() as srv:
        srv.files[PATH] = DATA
        yield srv


# ----------------------------------------------------------------------------- Hub client tests


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    """The Hub stand-in (``tests/hub_standin.py``) with no repo and ``hub_standin.TOKEN`` as its
    token, huggingface_hub pointed at it (``hub_env``: ``HF_HOME`` in ``tmp_path`` with no token
    file, Xet off) and no ``HF_TOKEN``. A module's own ``hub`` fixture adds its repos over it."""
    from huggingface_hub import constants

    from tests.hub_standin import TOKEN, HubStandin, hub_env

    with HubStandin(token=TOKEN) as server:
        for key, value in hub_env(server.endpoint, tmp_path / "hf-home").items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # read at the client's import
        yield server
