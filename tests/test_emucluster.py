"""``bin/emucluster``: an emulated cluster of network namespaces (needs root and ``ip netns``).

Set-up and tear-down must leave no namespace, bridge, veth or state behind,
also when the command fails or the script is interrupted; a tiny
``mpisparse bench step`` across 2 emulated hosts must run over their links.
The tests use instance 97 (bridge mpbr97, hosts mh97-1.., 10.210.97.0/24) so
they never touch a cluster someone brought up with the default instance.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import HERE

ROOT = HERE.parent
EMU = str(ROOT / "bin" / "emucluster")
INSTANCE = "97"


def _netns_usable() -> str | None:
    """None when the emulated cluster can run here, else why not."""
    if not sys.platform.startswith("linux"):
        return "Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    from mpisparse.mpi.launch import find_mpiexec, launcher_flavor

    if launcher_flavor(find_mpiexec()) != "mpich":
        return "bin/emucluster drives MPICH's Hydra launcher (-launcher rsh); this environment's mpiexec is not Hydra"
    for tool in ("ip", "tc", "unshare", "flock"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    name = f"mpisparse-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return "ip netns add is not permitted here"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


WHY_NOT = _netns_usable()
needs_netns = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster: {WHY_NOT}")


def emu(*args, timeout=120, env=None, **kw):
    full = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", **(env or {}))
    full["PATH"] = f"{Path(sys.executable).parent}:{full.get('PATH', '')}"
    for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        full.pop(k, None)
    return subprocess.run([EMU, *args], capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT, **kw)


def leftovers(instance: str = INSTANCE) -> list[str]:
    """Namespaces, links and state of an emulated-cluster instance (this module's by default) that still exist."""
    found = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    found += [line.split()[0] for line in ns if line.startswith(f"mh{instance}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()
    found += [line.split(": ")[1] for line in links if f"mpbr{instance}" in line.split(": ")[1]]
    if Path(f"/run/mpisparse-emucluster/{instance}").exists():
        found.append(f"/run/mpisparse-emucluster/{instance}")
    return found


@pytest.fixture
def clean():
    """Every test starts and ends without the test instance; a failing test still tears down."""
    emu("down", "--instance", INSTANCE)
    yield
    left = leftovers()
    emu("down", "--instance", INSTANCE)
    assert not left, f"left behind: {left}"


# --------------------------------------------------------------------------- no root needed
def test_help_says_what_it_needs():
    p = subprocess.run([EMU, "--help"], capture_output=True, text=True)
    assert p.returncode == 0
    for text in ("usage: bin/emucluster up N", "Needs root", "ip netns", "does NOT emulate separate CPUs"):
        assert text in p.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "2"], "emucluster: run needs a command after --, e.g. bin/emucluster run 2 -- mpisparse info"),
    (["up", "0"], "emucluster: N is '0'; the number of hosts must be an integer in 1..200"),
    (["up", "2", "--rate", "fast"], "emucluster: --rate is 'fast'; allowed: a tc rate such as 100mbit, 1gbit, 10gbit"),
    (["up", "2", "--instance", "100"], "emucluster: --instance is '100'; allowed: an integer in 0..99"),
    (["frobnicate"], "emucluster: unknown command 'frobnicate' (up, run, link-down, down, status; --help)"),
    (["run", "2", "--ranks-per-host", "0", "--", "true"],
     "emucluster: --ranks-per-host is '0'; allowed: an integer in 1..64"),
    (["up", "2", "--ranks-per-host", "2"], "emucluster: --ranks-per-host belongs to run"),
])
def test_bad_arguments_are_one_line_errors(args, message):
    p = subprocess.run([EMU, *args], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == message


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to drop it")
def test_without_root_it_fails_with_one_line():
    # uid 65534 may not be able to enter the checkout (a private home or a mode-700 temporary folder):
    # it runs a copy in a folder of its own that it can read, from a working directory it can enter
    public = Path(tempfile.mkdtemp(prefix="mpisparse-emu-"))
    try:
        public.chmod(0o755)
        copy = public / "emucluster"
        shutil.copyfile(EMU, copy)
        copy.chmod(0o755)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(copy), "up", "2",
                            "--instance", INSTANCE], capture_output=True, text=True, cwd=public, timeout=60)
    finally:
        shutil.rmtree(public, ignore_errors=True)
    assert p.returncode == 2
    assert p.stderr.strip() == "emucluster: needs root (network namespaces, veth links, tc); run it as root"


# --------------------------------------------------------------------------- root and ip netns
@needs_netns
def test_up_status_down_leave_nothing_behind(clean):
    p = emu("up", "3", "--rate", "100mbit", "--instance", INSTANCE)
    assert p.returncode == 0, p.stderr
    assert f"3 hosts mh{INSTANCE}-1..mh{INSTANCE}-3 (10.210.{INSTANCE}.1..3) on mpbr{INSTANCE}" in p.stdout
    assert len(leftovers()) == 1 + 3 + 3 + 1  # bridge, 3 namespaces, 3 bridge-side veths, state
    qdisc = subprocess.run(["ip", "netns", "exec", f"mh{INSTANCE}-2", "tc", "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout
    assert "tbf" in qdisc and "rate 100Mbit" in qdisc
    # the hosts reach each other through the bridge
    ping = subprocess.run(["ip", "netns", "exec", f"mh{INSTANCE}-1", "ping", "-c", "1", "-W", "2",
                           f"10.210.{INSTANCE}.3"], capture_output=True, text=True)
    assert ping.returncode == 0 or shutil.which("ping") is None, ping.stdout + ping.stderr
    st = emu("status", "--instance", INSTANCE)
    assert f"3 hosts on bridge mpbr{INSTANCE}" in st.stdout and "rate 100mbit each way" in st.stdout
    again = emu("up", "2", "--instance", INSTANCE)
    assert again.returncode == 2 and "already up" in again.stderr
    # run on a cluster that is up: uses it, reports this run's bytes only, leaves it up
    r = emu("run", "2", "--instance", INSTANCE, "--stats", "--timeout", "30", "--", "true")
    assert r.returncode == 0 and "during this run" in r.stdout, r.stdout + r.stderr
    assert len(leftovers()) == 8
    r = emu("run", "2", "--instance", INSTANCE, "--rate", "1gbit", "--", "true")
    assert r.returncode == 2 and "is up at rate 100mbit, not 1gbit" in r.stderr
    assert emu("down", "--instance", INSTANCE).returncode == 0
    assert leftovers() == []
    assert emu("down", "--instance", INSTANCE).returncode == 0  # idempotent


@needs_netns
@pytest.mark.mpi
def test_bench_step_across_two_emulated_hosts_then_teardown(clean, tmp_path):
    out, stats = tmp_path / "r.json", tmp_path / "links.json"
    p = emu("run", "2", "--rate", "1gbit", "--instance", INSTANCE, "--timeout", "120", "--stats-json", str(stats),
            "--", "mpisparse", "bench", "step", "--model", "ncf", "--scheme", "dense", "--iters", "1",
            "--warmup", "0", "--json", str(out), timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["world_size"] == 2
    links = json.loads(stats.read_text())
    assert [h["host"] for h in links["hosts"]] == [f"mh{INSTANCE}-1", f"mh{INSTANCE}-2"]
    # each host's link carried at least what the byte model counts for the step (one timed step)
    for h in links["hosts"]:
        assert h["sent_bytes"] >= res["bytes_sent_per_rank"] * 0.99, (h, res["bytes_sent_per_rank"])
    assert "sent_bytes" in p.stdout  # the --stats table
    assert leftovers() == []


@needs_netns
@pytest.mark.mpi
def test_ranks_run_on_distinct_hosts(clean, tmp_path):
    p = emu("run", "2", "--instance", INSTANCE, "--timeout", "60", "--", "mpisparse", "info", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "world size       2" in p.stdout
    assert f"host mh{INSTANCE}-1" in p.stdout and f"host mh{INSTANCE}-2" in p.stdout
    assert leftovers() == []


@needs_netns
@pytest.mark.mpi
def test_hierarchical_groups_ranks_by_emulated_host(clean, tmp_path):
    """2 hosts x 2 ranks: --hierarchical finds the hosts by name; its leaders alone cross the links."""
    out = tmp_path / "r.json"
    p = emu("run", "2", "--ranks-per-host", "2", "--instance", INSTANCE, "--timeout", "120", "--",
            "mpisparse", "bench", "step", "--model", "ncf", "--scheme", "cltk", "--density", "0.01", "--iters", "1",
            "--warmup", "0", "--hierarchical", "--json", str(out), timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["world_size"] == 4
    assert res["hierarchy"]["hosts"] == 2 and res["hierarchy"]["ranks_per_host"] == [2, 2]
    assert 0 < res["hierarchy"]["cross_host_bytes_per_step"]
    assert leftovers() == []


@needs_netns
def test_failing_command_still_tears_down(clean):
    p = emu("run", "2", "--instance", INSTANCE, "--timeout", "30", "--", "false")
    assert p.returncode != 0
    assert leftovers() == []


@needs_netns
def test_interrupt_tears_down(clean):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.Popen([EMU, "run", "2", "--instance", INSTANCE, "--timeout", "60", "--", "sleep", "50"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:  # wait until both hosts run the command
            ps = subprocess.run(["ip", "netns", "pids", f"mh{INSTANCE}-2"], capture_output=True, text=True).stdout
            if ps.strip():
                break
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "interrupted (SIGTERM)" in err
    assert leftovers() == []
