"""Start ``mpisparse ... -n W`` the way a user does and find every process of that job afterwards.

Each launch carries a unique ``MPISPARSE_TEST_JOB_ID`` in its environment;
every process of the job (the wrapper, ``mpiexec``, its proxies, the ranks)
inherits it, so :func:`job_pids` finds them by scanning ``/proc``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "MPISPARSE_TEST_JOB_ID"


def job_pids(job_id: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``MPISPARSE_TEST_JOB_ID=job_id``."""
    needle = f"{MARK}={job_id}\0".encode()
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/environ", "rb") as f:
                env = f.read() + b"\0"
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        if needle in env and stat[stat.rfind(")") + 2:][:1] not in ("Z", "X"):
            found.append(int(e))
    return found


def wait_gone(job_id: str, seconds: float = 10.0) -> list[int]:
    """Wait until no process of the job is left; the ones still there after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = job_pids(job_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def describe(pids: list[int]) -> str:
    out = []
    for p in pids:
        try:
            out.append(f"{p}: " + Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            pass
    return "; ".join(out)


def kill_job(job_id: str) -> None:
    """Clean-up after a failed assertion: nothing of the job may outlive the test."""
    for p in job_pids(job_id):
        try:
            os.kill(p, 9)
        except OSError:
            pass


class Job:
    """``python -m mpisparse ARGS`` in its own session, output to files, marked with a fresh job id."""

    def __init__(self, args: list[str], tmp: Path, env: dict[str, str] | None = None):
        self.id = uuid.uuid4().hex
        self.out, self.err = tmp / f"out-{self.id[:8]}.txt", tmp / f"err-{self.id[:8]}.txt"
        full = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
        full[MARK] = self.id
        full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH")) if p)
        for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
            full.pop(k, None)
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen([sys.executable, "-m", "mpisparse", *args], stdout=o, stderr=e,
                                         stdin=subprocess.DEVNULL, env=full, cwd=tmp, start_new_session=True)

    def wait_for(self, ready, seconds: float = 150.0) -> None:
        """Until ``ready()`` holds (training has started); fails if the job ends or time runs out first."""
        deadline = time.monotonic() + seconds
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended ({self.proc.returncode}) before it was ready:\n{self.text()}")
            if time.monotonic() > deadline:
                self.cleanup()
                raise AssertionError(f"the job was not ready within {seconds} s:\n{self.text()}")
            time.sleep(0.2)

    def wait(self, seconds: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.cleanup()
            raise AssertionError(f"the wrapper did not end within {seconds} s:\n{self.text()}") from None

    def text(self) -> str:
        return f"--- stdout\n{self.out.read_text()[-3000:]}\n--- stderr\n{self.err.read_text()[-3000:]}"

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_job(self.id)


def csv_rows(path: Path) -> int:
    """Data rows in a ``--csv`` step log (flushed per step), 0 while it does not exist."""
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except OSError:
        return 0
