"""``rlds preprocess --executor ray`` on a local two-node Ray cluster (1 CPU each), bound to
127.0.0.1 only: connecting through ``RAY_ADDRESS``, functions shipped to nodes that do not run
in the caller's directory, a worker killed mid-job, retries running out, a node that cannot see
the cache, and no socket of the cluster or of this process on a non-loopback address.

The cluster's nodes start in a directory of their own (as on other machines), so a relative
``--fn ./file.py:f`` or a package of the caller's directory is found there only if rlds ships it.
Skipped when Ray is not installed.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlds_cli import preprocess
from rlds_cli.cli.app import app
from rlds_cli.errors import CacheNotVisibleError
from rlds_cli.preprocess import executors, fnref
from tests.dataset_fixtures import make_dataset
from tests.waits import HANG_SECONDS

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlds-cli[ray]')")
# one test worker runs the module: one cluster started, not one in each worker
pytestmark = pytest.mark.xdist_group("ray")

try:  # the local S3 server of the remote tests (they need fsspec; these tests need Ray only)
    from tests.remote.test_remote import moto_endpoint
except pytest.skip.Exception:

    @pytest.fixture(scope="module")
    def moto_endpoint() -> str:
        pytest.skip("the remote extra (fsspec, s3fs) is not installed")


FNS = "tests.preprocess_fns"
LOOPBACK = "127.0.0.1"
VICTIM_VAR = "PREPROCESS_TEST_VICTIM_NODE"  # set in the second node's processes only

# one function file, written into the caller's directory by the tests that need it
SCALE = """
import numpy as np

def scale(batch):
    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = (batch[key] * 0.5 - 1).astype(np.float32)
    return out
"""


def _keep_loopback(host: str) -> str:
    return host


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two Ray nodes of 1 CPU each on 127.0.0.1 (node address of every component, no dashboard)."""
    from ray._private import services, utils
    from ray.cluster_utils import Cluster

    nodes_cwd = tmp_path_factory.mktemp("ray-nodes-cwd")
    # short: Ray's Unix socket paths live under it (at most 107 bytes)
    temp_dir = tempfile.mkdtemp(prefix="rlds-ray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        # Ray 2.60 turns 127.0.0.1 into the machine's external address when a driver connects
        # (ray-project/ray#59110), so this process would talk to the cluster over it
        mp.setattr(services, "resolve_ip_for_localhost", _keep_loopback)
        # and this machine's other Ray users must not find this cluster through /tmp/ray
        mp.setattr(utils, "write_ray_address", lambda *a, **k: None)
        node = {"node_ip_address": LOOPBACK, "num_cpus": 1, "object_store_memory": 80 * 2**20}
        caller = os.getcwd()
        os.chdir(nodes_cwd)  # the nodes' processes (and their workers) run there
        try:
            started = Cluster(
                initialize_head=True,
                head_node_args={**node, "include_dashboard": False, "temp_dir": temp_dir},
            )
        finally:
            os.chdir(caller)
        try:
            os.chdir(nodes_cwd)
            # the second node's processes inherit this variable: a function can tell its node
            os.environ[VICTIM_VAR] = "1"
            try:
                started.victim = started.add_node(**node)
            finally:
                os.chdir(caller)
                del os.environ[VICTIM_VAR]
            started.wait_for_nodes()  # both nodes registered before a job is scheduled
            yield started
        finally:
            if ray.is_initialized():
                ray.shutdown()
            started.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def on_cluster(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The cluster's address in ``RAY_ADDRESS``, as a user points rlds at a cluster."""
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    yield cluster
    if ray.is_initialized():
        ray.shutdown()


def same_files(a: Path, b: Path) -> None:
    """Every file of two published datasets byte-identical, the manifests but for name and time."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        if rel.name != "manifest.json":
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def same_output(local: Any, remote: Any) -> None:
    same_files(local.path, remote.path)
    x, y = local.manifest.to_dict(), remote.manifest.to_dict()
    for m in (x, y):
        m.pop("created_at"), m.pop("name")
    assert x == y


def act_when(ready: Callable[[], bool], act: Callable[[], None]) -> tuple[threading.Thread, list[bool]]:
    """A started thread that calls ``act`` once ``ready()`` is true (checked every 50 ms, for
    at most ``HANG_SECONDS``: a bound on a hang), and a list that holds ``True`` once it has."""
    done: list[bool] = []

    def watch() -> None:
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:
            if ready():
                act()
                done.append(True)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


def test_connecting_passes_no_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert executors.ray_init_kwargs(None, 3)["num_cpus"] == 3
    assert executors.ray_init_kwargs(None, 3)["address"] == "local"  # never a `ray start` cluster
    assert "num_cpus" not in executors.ray_init_kwargs("10.0.0.1:6379", 3)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    kwargs = executors.ray_init_kwargs(None, 3)
    assert kwargs["address"] is None and "num_cpus" not in kwargs


def test_shipped_file_function_needs_no_file(tmp_path: Path) -> None:
    path = tmp_path / "gone.py"
    path.write_text("def f(batch):\n    raise ValueError('boom from the shipped bytes')\n")
    shipped = fnref.file_source(f"{path}:f")
    path.unlink()  # as on a node that does not have the file
    fn = fnref.resolve(f"{path}:f", shipped)
    with pytest.raises(ValueError) as caught:
        fn({})
    # the traceback shows the shipped source lines, not those of whatever the node has
    shown = "".join(traceback.format_exception(caught.value))
    assert "raise ValueError('boom from the shipped bytes')" in shown


def test_module_root_ships_only_what_is_not_installed() -> None:
    import tests.preprocess_fns  # noqa: F401  (module_root looks at imported modules)

    assert fnref.module_root("numpy.linalg:norm") is None  # installed: every node has it
    assert fnref.module_root(f"{FNS}:identity") == str(Path(__file__).resolve().parents[1])
    assert fnref.module_root("./x.py:f") is None  # a file: its bytes are shipped instead


@pytest.mark.slow
@pytest.mark.parametrize("by", ["step", "episode"])
def test_byte_identical_to_local_through_ray_address(on_cluster: Any, by: str) -> None:
    make_dataset("src", [30, 1, 45, 12, 60, 2, 50])
    fn = f"{FNS}:returns_to_go" if by == "episode" else f"{FNS}:normalize"
    local = preprocess.run("src", fn, "local", by=by, chunk_steps=16, workers=1, stats=True)
    # --workers with a cluster: no num_cpus for ray.init, which Ray refuses when connecting
    remote = preprocess.run("src", fn, "remote", by=by, chunk_steps=16, workers=2, backend="ray", stats=True)
    same_output(local, remote)


@pytest.mark.slow
def test_file_function_is_shipped_to_the_nodes(
    on_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "scalefns.py").write_text(SCALE)
    monkeypatch.chdir(project)  # the nodes run elsewhere: ./scalefns.py is not there
    make_dataset("src", [20, 7, 33])
    local = preprocess.run("src", "./scalefns.py:scale", "local", chunk_steps=16, workers=1)
    remote = preprocess.run("src", "./scalefns.py:scale", "remote", chunk_steps=16, backend="ray")
    same_output(local, remote)
    assert remote.manifest.lineage[0]["fn"] == "./scalefns.py:scale"


@pytest.mark.slow
def test_package_outside_the_installed_ones_is_shipped(
    on_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    package = project / "rlds_ship_test_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    # the package refuses to load from the caller's directory in any other process: a node on
    # another machine does not have it, and must import the copy that rlds shipped
    guard = f"""
        import os
        if os.getpid() != {os.getpid()} and os.path.realpath(__file__).startswith({str(project)!r}):
            raise ImportError("this node cannot see the caller's directory")
    """
    (package / "fns.py").write_text(textwrap.dedent(guard) + SCALE)
    # on this caller's sys.path (as through PYTHONPATH), not in its working directory, which
    # Ray itself adds to the workers' sys.path: on one machine that would hide a missing copy
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.chdir(tmp_path)
    make_dataset("src", [20, 7, 33])
    local = preprocess.run("src", "rlds_ship_test_pkg.fns:scale", "local", chunk_steps=16, workers=1)
    remote = preprocess.run("src", "rlds_ship_test_pkg.fns:scale", "remote", chunk_steps=16, backend="ray")
    same_output(local, remote)


KILLED_ONCE = """
import os
import time

MARKER = {marker!r}

def scale(batch):
    # the first chunk task anywhere (not schema inference, which reads step 0 in the coordinator)
    # records its process and stalls until the test kills that process
    if batch["index"][0] > 0:
        try:
            fd = os.open(MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep({hang})  # the stall the test ends by killing this process
    return dict(batch)
"""


@pytest.mark.slow
def test_worker_killed_mid_job_is_retried(on_cluster: Any, tmp_path: Path) -> None:
    marker = tmp_path / "stalled.pid"
    fns = tmp_path / "killfns.py"
    fns.write_text(KILLED_ONCE.format(marker=str(marker), hang=HANG_SECONDS))
    make_dataset("src", [10] * 8)

    def kill_the_stalled_worker() -> None:
        pid = int(marker.read_text())
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)

    killer, killed = act_when(lambda: marker.is_file() and bool(marker.read_text()), kill_the_stalled_worker)
    remote = preprocess.run("src", f"{fns}:scale", "remote", chunk_steps=10, backend="ray", stats=True)
    killer.join(timeout=HANG_SECONDS)
    assert killed, "no worker stalled"
    local = preprocess.run("src", f"{fns}:scale", "local", chunk_steps=10, workers=1, stats=True)
    same_output(local, remote)


DIES = """
import os
import signal

def dies(batch):
    if batch["index"][0] > 0:  # every attempt at the second chunk loses its worker
        os.kill(os.getpid(), signal.SIGKILL)
    return dict(batch)
"""


@pytest.mark.slow
def test_retries_running_out_name_the_chunk_and_resume(
    on_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fns = tmp_path / "diefns.py"
    fns.write_text(DIES)
    make_dataset("src", [10, 10])
    monkeypatch.setattr(executors, "RAY_MAX_RETRIES", 1)
    fn = f"{fns}:dies"
    args = ["preprocess", "src", "--fn", fn, "--name", "out", "--chunk-steps", "10", "--executor", "ray"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[-2].startswith("error: chunk 1 (steps 10-19) failed 2 times on Ray"), result.stderr
    assert lines[-1].startswith("hint: ") and "--resume" in lines[-1]


@pytest.mark.slow
def test_a_node_that_cannot_see_the_cache_says_so(on_cluster: Any, isolated_cache: Path) -> None:
    make_dataset("src", [10, 10])
    source = isolated_cache / "datasets" / "src"
    hidden = isolated_cache / "elsewhere"

    def hide_the_source(event: str, amount: int) -> None:
        # once the coordinator has done its own reading, the source is gone for the nodes, as
        # on a node that does not mount the cache
        if event == "start":
            source.rename(hidden)

    with pytest.raises(CacheNotVisibleError) as caught:
        preprocess.run(
            "src", f"{FNS}:identity", "out", chunk_steps=10, backend="ray", progress=hide_the_source
        )
    message = caught.value.message
    where = f"node {socket.gethostname()} ({LOOPBACK})"
    assert message.startswith(f"{where} cannot see {source / 'manifest.json'}"), message
    assert "same path on every node" in message and "\n" not in message
    assert "shared filesystem" in caught.value.hint


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.mark.slow
def test_the_cluster_talks_over_loopback_only(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil  # Ray's own copy (ray/thirdparty_files), on sys.path once ray is imported

    make_dataset("src", [10, 10, 10])
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        # a job on both nodes, this process staying connected while its sockets are read
        preprocess.run("src", f"{FNS}:normalize", "out", chunk_steps=10, backend="ray")
        assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {LOOPBACK}
        me = psutil.Process()
        seen = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                connections = proc.net_connections(kind="inet")
            except psutil.NoSuchProcess:
                continue
            for conn in connections:
                seen += 1
                ends = [conn.laddr, *([conn.raddr] if conn.raddr else [])]
                assert all(_is_loopback(end.ip) for end in ends), (proc.name(), conn)
        assert seen > 10  # the cluster's processes are this process's children
    finally:
        ray.shutdown()


NODE_LOST = """
import os
import time

MARKER = {marker!r}

def scale(batch):
    # every chunk task on the second node stalls (the first one says so) until the test kills
    # that whole node; Ray runs them again on the head node
    if os.environ.get({var!r}):
        try:
            fd = os.open(MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
        time.sleep({hang})  # the stall the test ends by taking the node away
    # on the head node, a chunk after step 0 (not schema inference, in the caller) waits until
    # the second node has taken a chunk, however long that cold node takes to start a worker:
    # the head cannot finish them all first (the mark ends the wait; the deadline bounds a hang)
    if batch["index"][0] > 0:
        deadline = time.monotonic() + {hang}
        while not os.path.exists(MARKER):
            if time.monotonic() > deadline:
                raise AssertionError("the second node took no chunk in {hang} s: a hang")
            time.sleep(0.01)
    return dict(batch)
"""


@pytest.mark.slow
def test_remote_zarr_in_and_out_survives_a_node_loss_with_no_shared_disk(
    cluster: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    moto_endpoint: str,
) -> None:
    """Source and output on the local S3 server: tasks read the source's chunks from the store
    and put their chunks there; a node lost mid-job still gives the files of a local run."""
    import s3fs

    from rlds_cli.remote.push import push
    from tests.remote.test_remote import s3_env

    env = s3_env(moto_endpoint)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("rayjob")
    make_dataset("src", [10] * 8, backend="zarr")
    push("src", "s3://rayjob/src")
    # a third node (1 CPU) that this test takes away while its tasks stall
    marker = tmp_path / "stalled"
    var = "PREPROCESS_TEST_S3_VICTIM"
    fns = tmp_path / "s3nodefns.py"
    fns.write_text(NODE_LOST.format(marker=str(marker), var=var, hang=HANG_SECONDS))
    caller = os.getcwd()
    os.chdir(tmp_path)
    os.environ[var] = "1"
    try:
        victim = cluster.add_node(node_ip_address=LOOPBACK, num_cpus=1, object_store_memory=80 * 2**20)
    finally:
        os.chdir(caller)
        del os.environ[var]
    cluster.wait_for_nodes()

    # the nodes get the store's endpoint and credentials from the job's runtime environment
    ray.init(
        address=cluster.address, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}
    )
    killer, removed = act_when(marker.exists, lambda: cluster.remove_node(victim, allow_graceful=False))
    try:
        remote = preprocess.run(
            "s3://rayjob/src", f"{fns}:scale", "s3://rayjob/out", chunk_steps=10, backend="ray", stats=True
        )
    finally:
        killer.join(timeout=HANG_SECONDS)
        if victim in cluster.worker_nodes:
            cluster.remove_node(victim, allow_graceful=False)
        ray.shutdown()
    assert removed, "no task ran on the node taken away"
    assert remote.url == "s3://rayjob/out"
    local = preprocess.run("src", f"{fns}:scale", "local", chunk_steps=10, workers=1, stats=True)
    fs.invalidate_cache()
    pushed = {p.removeprefix("rayjob/out/"): fs.cat_file(p) for p in fs.find("rayjob/out")}
    mine = {
        p.relative_to(local.path).as_posix(): p.read_bytes() for p in local.path.rglob("*") if p.is_file()
    }
    assert set(pushed) == set(mine) | {"rlds-files.json"}
    for rel, data in mine.items():
        if rel != "manifest.json":
            assert pushed[rel] == data, rel
    assert not [p for p in fs.find("rayjob") if ".rlds-job-" in p]  # the job's area is gone


@pytest.mark.slow
def test_worker_node_lost_mid_job_is_retried(on_cluster: Any, tmp_path: Path) -> None:
    # the module's last test: it takes the second node away (the others pass on one node too)
    marker = tmp_path / "stalled"
    fns = tmp_path / "nodefns.py"
    fns.write_text(NODE_LOST.format(marker=str(marker), var=VICTIM_VAR, hang=HANG_SECONDS))
    make_dataset("src", [10] * 8)
    # SIGKILL, all of the node
    killer, removed = act_when(
        marker.exists, lambda: on_cluster.remove_node(on_cluster.victim, allow_graceful=False)
    )
    remote = preprocess.run("src", f"{fns}:scale", "remote", chunk_steps=10, backend="ray", stats=True)
    killer.join(timeout=HANG_SECONDS)
    assert removed, "no task ran on the second node"
    local = preprocess.run("src", f"{fns}:scale", "local", chunk_steps=10, workers=1, stats=True)
    same_output(local, remote)
