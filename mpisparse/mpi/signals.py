"""Signals across the ``-n W`` re-launch: the wrapper forwards them, ranks outlive no launcher.

``mpisparse ... -n W`` runs ``mpiexec`` as its child (:func:`run_launcher`):

* SIGUSR1 to the wrapper is passed on to ``mpiexec``, which hands it to every
  rank (MPICH's Hydra and Open MPI both do): ``train --checkpoint`` writes a
  checkpoint at the next step boundary and the job exits 0.
* SIGTERM, SIGHUP, SIGINT (and SIGQUIT) stop the job: ``mpiexec`` gets SIGTERM
  (Hydra passes it to the ranks, Open MPI ends them), then SIGKILL after
  :data:`STOP_GRACE` seconds; the wrapper exits ``128 + signal``.
* SIGKILL gives the wrapper no chance: ``mpiexec`` gets SIGTERM from the kernel
  when its parent dies (``PR_SET_PDEATHSIG``, Linux), and every rank watches
  the wrapper and its own parent (:func:`watch_launcher`) and ends itself
  within a second of either going.

Nothing here imports MPI or torch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

__all__ = ["STOP_GRACE", "WRAPPER_PID", "early_usr1", "install_early_usr1", "run_launcher", "watch_launcher"]

#: the environment variable naming the wrapper's process (``host:pid:start-time``) in every rank it starts
WRAPPER_PID = "MPISPARSE_WRAPPER_PID"
#: seconds ``mpiexec`` has to end the job after SIGTERM before it is killed
STOP_GRACE = 5.0
#: how often a rank looks at its launcher
WATCH_INTERVAL = 0.5

_STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT") if hasattr(signal, s))


# --------------------------------------------------------------------------- processes
def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/PID/stat`` field 22), None if it is gone or a zombie.

    Outside Linux (no ``/proc``) ``"?"`` while ``kill(pid, 0)`` finds it.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else "?"


def _alive(pid: int, start: str) -> bool:
    now = _start_time(pid)
    return now is not None and (now == start or "?" in (now, start))


def _pdeathsig() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux); exit if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(143)


def _job_processes(token: str) -> list[int]:
    """Processes (other than this one) whose environment carries ``WRAPPER_PID=token``; Linux only."""
    needle = f"{WRAPPER_PID}={token}".encode() + b"\0"
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for e in entries:
        if not e.isdigit() or int(e) == os.getpid():
            continue
        try:
            with open(f"/proc/{e}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(e))
        except OSError:
            continue
    return found


# --------------------------------------------------------------------------- the wrapper
def run_launcher(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` (``mpiexec ...``) as a child, forwarding signals; its exit code, or ``128 + signal``.

    ``env`` gets :data:`WRAPPER_PID` so the ranks can watch this process.
    """
    # host:pid:start-time: ranks on other hosts cannot see this process and must not look for it
    token = f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"
    env = dict(env, **{WRAPPER_PID: token})
    state: dict = {"proc": None, "stop": None, "stop_at": None, "usr1": 0}

    def forward(signum, frame) -> None:
        proc = state["proc"]
        if signum == getattr(signal, "SIGUSR1", None):
            if proc is None:
                state["usr1"] += 1
            else:
                _send(proc, signum)
            return
        if state["stop"] is not None and proc is not None:  # a second stop signal: no more grace
            _kill(proc)
            return
        state["stop"], state["stop_at"] = signum, time.monotonic()
        try:
            os.write(2, f"mpisparse: {signal.Signals(signum).name}: stopping the job\n".encode())
        except (OSError, ValueError):
            pass
        if proc is not None:
            _send(proc, signal.SIGTERM)

    watched = _STOP_SIGNALS + ((signal.SIGUSR1,) if hasattr(signal, "SIGUSR1") else ())
    old = {}
    for s in watched:
        try:
            old[s] = signal.signal(s, forward)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        try:
            proc = subprocess.Popen(list(argv), env=env,
                                    preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None)
        except OSError as e:
            raise RuntimeError(f"cannot start {argv[0]}: {e.strerror or e}; set MPISPARSE_MPIEXEC to a working "
                               "mpiexec") from None
        state["proc"] = proc
        if state["stop"] is not None:
            _send(proc, signal.SIGTERM)
        for _ in range(state["usr1"]):
            _send(proc, signal.SIGUSR1)
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if state["stop"] is not None and time.monotonic() - state["stop_at"] > STOP_GRACE:
                    _kill(proc)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if state["stop"] is not None:
        # ranks mpiexec could not reach (or a launcher that left them): end them too
        for pid in _job_processes(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return 128 + int(state["stop"])
    return code


def _send(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except OSError:
        pass


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
    except OSError:
        pass


# --------------------------------------------------------------------------- in each rank
_EARLY_USR1 = {"seen": False}


def install_early_usr1() -> None:
    """Remember a SIGUSR1 that arrives before training installs its own handler (instead of dying of it)."""
    if not hasattr(signal, "SIGUSR1"):
        return

    def note(signum, frame) -> None:
        _EARLY_USR1["seen"] = True

    try:
        signal.signal(signal.SIGUSR1, note)
    except ValueError:
        pass


def ignore_late_usr1() -> None:
    """After training: a SIGUSR1 now (SLURM's time-limit warning arriving after the last step) has nothing to
    checkpoint.  Ignore it for the rest of the process: Python's teardown resets the handlers it installed to
    the default action, which would end a finished rank with exit status 138 and its job as FAILED."""
    if hasattr(signal, "SIGUSR1"):
        try:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass


def early_usr1() -> bool:
    """Whether a SIGUSR1 arrived before training's handler took over (see :func:`install_early_usr1`)."""
    return _EARLY_USR1["seen"]


def watch_launcher(env: Mapping[str, str] = os.environ, interval: float = WATCH_INTERVAL) -> threading.Thread | None:
    """In a rank: end this process when its parent or the ``-n`` wrapper that started the job is gone.

    A launcher killed with SIGKILL cannot pass anything on; its ranks would go
    on training (and moving the checkpoint) unseen.  The watch is a daemon
    thread that polls every ``interval`` seconds.
    """
    parent = os.getppid()
    if parent <= 1 or _WATCHING:
        return None
    wrapper = None
    token = env.get(WRAPPER_PID, "")
    parts = token.rsplit(":", 2)
    if len(parts) == 3 and parts[0] == socket.gethostname() and parts[1].isdigit():
        wrapper = (int(parts[1]), parts[2])

    def gone() -> str | None:
        if os.getppid() != parent:
            return f"its launcher (pid {parent})"
        if wrapper is not None and not _alive(*wrapper):
            return f"the mpisparse -n process (pid {wrapper[0]})"
        return None

    def watch() -> None:
        while True:
            time.sleep(interval)
            what = gone()
            if what is not None:
                try:
                    os.write(2, f"mpisparse: {what} is gone; this rank (pid {os.getpid()}) stops\n".encode())
                except OSError:
                    pass
                os._exit(143)

    t = threading.Thread(target=watch, name="mpisparse-launcher-watch", daemon=True)
    t.start()
    _WATCHING.append(t)
    return t


_WATCHING: list[threading.Thread] = []
