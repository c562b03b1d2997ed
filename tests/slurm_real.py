"""A private one-node SLURM cluster for the tests (tests/test_slurm_real.py).

:func:`start` writes a ``slurm.conf`` into a temporary directory, makes a
munge key and starts ``munged`` (its own socket), ``slurmctld`` and
``slurmd`` in the foreground of processes this module started; clients find
the cluster through ``SLURM_CONF`` in :attr:`Cluster.env`.  Everything the
daemons write (state, spool, logs, pid files) stays in that directory; they
listen on free ports on the loopback address, so a SLURM or munge already on
the machine is left alone.  :meth:`Cluster.stop` cancels the jobs and ends
the three daemons by their process ids.

:func:`unavailable` says why there can be no cluster here (one line), or
None.  Debian's ``slurmctld slurmd slurm-client munge`` packages provide the
programs (.ci/run installs them when it runs as root).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "scancel", "sinfo", "srun")
#: where Debian puts the daemons (often not on a user's PATH)
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
#: job states after which a job no longer runs
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY")


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def unavailable() -> str | None:
    """Why a private cluster cannot run here (one line), or None."""
    if not sys.platform.startswith("linux"):
        return f"a private SLURM cluster needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "a private SLURM cluster needs root (slurmd runs jobs as their user; SlurmUser=root)"
    missing = [n for n in DAEMONS + CLIENTS if which(n) is None]
    if missing:
        return (f"SLURM/munge programs missing: {', '.join(missing)} "
                "(apt-get install slurmctld slurmd slurm-client munge; .ci/run does it as root)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _meminfo_mb() -> int:
    try:
        text = Path("/proc/meminfo").read_text()
        return int(re.search(r"MemTotal:\s+(\d+)", text).group(1)) // 1024
    except (OSError, AttributeError):
        return 1024


def slurm_conf(d: Path, host: str, cpus: int, memory_mb: int, ctld_port: int, slurmd_port: int) -> str:
    """The ``slurm.conf`` of the one-node cluster in ``d`` (the node is ``host`` at 127.0.0.1)."""
    return f"""\
# a private one-node cluster for mpisparse's tests (tests/slurm_real.py)
ClusterName=mpisparsetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket={d}/munge.socket,cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
# a pending job (a requeued one, once cred_expire has passed) is looked at every 2 s, not every 60 s
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def parse_show(text: str) -> dict[str, str]:
    """``scontrol show ... -o`` (one line of Key=Value words) as a dict (values without spaces)."""
    out: dict[str, str] = {}
    for word in text.split():
        if "=" in word:
            k, v = word.split("=", 1)
            out.setdefault(k, v)
    return out


@dataclass
class Cluster:
    dir: Path
    host: str
    cpus: int
    env: dict[str, str]  # clients' environment: SLURM_CONF, PATH with the daemons' sbin
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    # ------------------------------------------------------------------ clients
    def run(self, *cmd: str, timeout: float = 30, check: bool = True, env: dict | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env or self.env,
                           cwd=cwd)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    def job_env(self, **extra: str) -> dict[str, str]:
        """An environment to submit from: this one, less any SLURM/PMI job variables, plus the cluster's."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_COMM_WORLD"))}
        env["SLURM_CONF"] = self.env["SLURM_CONF"]
        env.update(extra)
        return env

    def sbatch(self, script: Path, env: dict[str, str]) -> str:
        """Submit ``script`` from its directory (``--export=ALL``: the job sees ``env``); its job id."""
        p = self.run("sbatch", "--parsable", "--export=ALL", str(script), env=env, cwd=script.parent)
        return p.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict ({} once SLURM no longer knows the job)."""
        p = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return parse_show(p.stdout) if p.returncode == 0 else {}

    def wait(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Poll the job until ``until(info)`` (default: it has ended); TimeoutError naming the last state."""
        until = until or (lambda info: info.get("JobState") in ENDED)
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if until(info):
                return info
            time.sleep(0.5)
        self.run("scancel", job_id, check=False)  # the next test's job must not queue behind it
        raise TimeoutError(f"job {job_id} after {timeout:.0f} s: JobState={info.get('JobState')} "
                           f"Reason={info.get('Reason')}\n{self.logs()}")

    def node_state(self) -> str:
        p = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return p.stdout.strip()

    def logs(self, lines: int = 30) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            f = self.dir / name
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    # ------------------------------------------------------------------ daemons
    def stop(self) -> None:
        """Cancel every job, then end slurmd, slurmctld and munged (TERM, then KILL), by their ids."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--partition=debug", check=False, timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    p = self.run("scontrol", "show", "job", "-o", check=False, timeout=10)
                    if not re.search(r"JobState=(RUNNING|COMPLETING|CONFIGURING|SUSPENDED)", p.stdout):
                        break
                    time.sleep(0.5)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def start(base: Path, timeout: float = 60) -> Cluster:
    """Start the cluster in directory ``base`` and wait (``timeout`` s) until its node is idle.

    On failure the daemons already started are stopped and RuntimeError
    names the step, with the daemons' log tails.
    """
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    for sub in ("state", "spool"):
        (base / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    cpus = max(os.cpu_count() or 1, 2)  # two ranks on one node, even on a one-core machine
    memory = max(_meminfo_mb() - 512, 256)
    conf = base / "slurm.conf"
    conf.write_text(slurm_conf(base, host, cpus, memory, free_port(), free_port()))
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sbin_path = os.pathsep.join([*SBIN, os.environ.get("PATH", "")])
    env = dict(os.environ, SLURM_CONF=str(conf), PATH=sbin_path)
    cluster = Cluster(base, host, cpus, env)
    sock = base / "munge.socket"
    try:
        # --force: munged otherwise refuses a socket in a directory that is not open to all (ours is 0700)
        cluster.procs["munged"] = subprocess.Popen(
            [which("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={base / 'munged.pid'}", f"--log-file={base / 'munged.log'}",
             f"--seed-file={base / 'munged.seed'}"],
            stdout=subprocess.DEVNULL, stderr=open(base / "munged.stderr", "w"), start_new_session=True)
        _wait_for(lambda: sock.exists(), 10, "munged's socket", cluster)
        for name in ("slurmctld", "slurmd"):
            cluster.procs[name] = subprocess.Popen(
                [which(name), "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                stderr=open(base / f"{name}.stderr", "w"), start_new_session=True)
        _wait_for(lambda: cluster.node_state() == "idle", timeout, f"node {host} idle in sinfo", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(ok, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
        if dead:
            err = "".join((cluster.dir / f"{n}.stderr").read_text(errors="replace")[-2000:] for n in dead
                          if (cluster.dir / f"{n}.stderr").exists())
            raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}: {err.strip()}\n{cluster.logs()}")
        if ok():
            return
        time.sleep(0.25)
    raise RuntimeError(f"no {what} after {timeout:.0f} s (sinfo: {cluster.node_state()!r})\n{cluster.logs()}")
