"""Running ``mpisparse`` jobs as subprocesses: ``bench scaling`` and ``reproduce`` drive them.

A :class:`SubRun` is one ``mpisparse`` command (``bench step``, ``train``,
``bench select`` ...) on ``n`` ranks (or one process, ``n=None``).
:func:`display_command` is the command line a user would type to run it
(printed before it runs); :func:`launch_argv` is what actually runs:

* shared memory / the allocation's network: ``python -m mpisparse CMD -n W
  --timeout T OPTIONS`` (``-n`` re-runs it under ``mpiexec``, see
  :mod:`mpisparse.mpi.launch`);
* the emulated cluster (:func:`emucluster_status`):
  ``bin/emucluster run W --rate R --timeout T -- mpisparse CMD OPTIONS``,
  one rank per emulated host behind a rate-limited link.

The child's environment drops the MPI launcher's variables (``PMI_*``,
``OMPI_*``, ``PMIX_*``), so a driver started inside an MPI job still starts
fresh jobs, and adds the run's own variables (``OMP_NUM_THREADS=1`` by
default: ranks share the machine's cores).  Each job is bounded twice:
``--timeout`` (``MPIEXEC_TIMEOUT``) and a subprocess timeout 60 s longer,
after which the job's process group is killed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["SubRun", "RunFailed", "Outcome", "display_command", "launch_argv", "child_env", "run_subrun",
           "emucluster_script", "emucluster_status", "LAUNCHER_VAR_PREFIXES"]

#: environment variables of an MPI launcher, dropped from a child's environment
LAUNCHER_VAR_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")
#: extra seconds the subprocess may take beyond the MPI job's own --timeout
GRACE_SECONDS = 60


@dataclass
class SubRun:
    """One ``mpisparse`` command: ``mpisparse COMMAND [-n N] OPTIONS``."""

    command: list[str]
    options: list[str]
    n: int | None = None
    #: where the command writes its JSON (``--json`` is among ``options``)
    json_path: Path | None = None
    #: environment of the run, shown in front of the command line
    env: dict[str, str] = field(default_factory=lambda: {"OMP_NUM_THREADS": "1"})
    #: run it on the emulated cluster at this link rate (None: plain mpiexec)
    emucluster_rate: str | None = None
    #: label for messages
    label: str = ""


class RunFailed(RuntimeError):
    """A sub-job exited non-zero or ran past its time limit."""


@dataclass
class Outcome:
    run: SubRun
    returncode: int
    seconds: float
    stdout: str
    stderr: str
    result: Any = None


def _fmt_env(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={shlex.quote(v)}" for k, v in env.items()]


def display_command(run: SubRun, timeout: int | None = None) -> str:
    """The command line a user would type (``mpisparse`` on PATH; the emulated cluster via bin/)."""
    words = list(_fmt_env(run.env))
    if run.emucluster_rate:
        words += ["bin/emucluster", "run", str(run.n or 1), "--rate", run.emucluster_rate]
        if timeout:
            words += ["--timeout", str(timeout)]
        words += ["--", "mpisparse", *run.command, *run.options]
    else:
        words += ["mpisparse", *run.command]
        if run.n is not None:
            words += ["-n", str(run.n)]
        words += run.options
    return " ".join(w if w.startswith(tuple(f"{k}=" for k in run.env)) else shlex.quote(w) for w in words)


def emucluster_script() -> Path | None:
    """``bin/emucluster`` of this source tree, else one on ``PATH``."""
    here = Path(__file__).resolve().parents[2] / "bin" / "emucluster"
    if here.is_file():
        return here
    found = shutil.which("emucluster")
    return Path(found) if found else None


def emucluster_status() -> tuple[bool, str]:
    """``(available, reason)``: whether ``bin/emucluster`` can run here.

    Linux, root, ``ip``/``tc``/``unshare``, and a probe that builds a veth
    pair, a bridge and a tbf qdisc in a throw-away network namespace (the
    host's network is not touched).
    """
    script = emucluster_script()
    if script is None:
        return False, "bin/emucluster not found (a source checkout has it)"
    if not sys.platform.startswith("linux"):
        return False, f"the emulated cluster needs Linux network namespaces (this is {sys.platform})"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "the emulated cluster needs root (network namespaces, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return False, f"the emulated cluster needs `{tool}` (iproute2, util-linux)"
    return _probe_links()


_PROBE: tuple[bool, str] | None = None


def _probe_links() -> tuple[bool, str]:
    """Create a veth pair, a bridge and a tbf qdisc inside a throw-away network namespace (once)."""
    global _PROBE
    if _PROBE is None:
        cmd = ("ip link add mpsprobe0 type veth peer name mpsprobe1 && ip link add mpsprobeb type bridge && "
               "tc qdisc add dev mpsprobe0 root tbf rate 1gbit burst 128kb latency 20ms")
        try:
            p = subprocess.run(["unshare", "--net", "--", "sh", "-c", cmd], capture_output=True, text=True,
                               timeout=30)
            ok = p.returncode == 0
            why = "" if ok else (p.stderr.strip().splitlines() or ["failed"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, str(e)
        _PROBE = (True, "available") if ok else (False, f"cannot create links in a network namespace: {why}")
    return _PROBE


def launch_argv(run: SubRun, timeout: int | None = None) -> list[str]:
    """The argument list that runs ``run`` from this Python."""
    if run.emucluster_rate:
        script = emucluster_script()
        if script is None:
            raise RunFailed("bin/emucluster not found")
        argv = ["bash", str(script), "run", str(run.n or 1), "--rate", run.emucluster_rate]
        if timeout:
            argv += ["--timeout", str(timeout)]
        return argv + ["--", "mpisparse", *run.command, *run.options]
    argv = [sys.executable, "-m", "mpisparse", *run.command]
    if run.n is not None:
        argv += ["-n", str(run.n)]
        if timeout:
            argv += ["--timeout", str(timeout)]
    return argv + run.options


def child_env(run: SubRun, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` without the MPI launcher's variables, plus the run's own and ``PYTHON``."""
    env = {k: v for k, v in base.items() if not k.startswith(LAUNCHER_VAR_PREFIXES)}
    env.pop("MPISPARSE_SPAWNED", None)
    env.update(run.env)
    env.setdefault("PYTHON", sys.executable)  # bin/emucluster runs ranks with this interpreter
    bindir = str(Path(sys.executable).parent)
    if bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _pump(pipe, keep: list[str], echo: Callable[[str], None]) -> None:
    """Read ``pipe`` line by line into ``keep``; pass the job's progress lines (``[label] ...``) to ``echo``."""
    for line in pipe:
        keep.append(line)
        if line.startswith("["):
            echo("        " + line.rstrip("\n"))
    pipe.close()


def run_subrun(run: SubRun, *, timeout: int | None = None, stream: bool = False,
               echo: Callable[[str], None] | None = None, progress: Callable[[str], None] | None = None) -> Outcome:
    """Run ``run``; returns its :class:`Outcome` with the JSON it wrote, or raises :class:`RunFailed`.

    ``stream`` shows the job's output as it runs (otherwise it is kept and
    its tail shown only on failure); ``progress`` receives the job's
    progress lines as they come (its stderr is still kept).
    """
    argv = launch_argv(run, timeout)
    if run.json_path is not None:
        Path(run.json_path).parent.mkdir(parents=True, exist_ok=True)
        if Path(run.json_path).exists():
            Path(run.json_path).unlink()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=child_env(run), stdout=None if stream else subprocess.PIPE,
                            stderr=None if stream else subprocess.PIPE, text=True, start_new_session=True)
    pump, err_lines = None, []
    if progress is not None and not stream:  # stderr read by a thread that forwards progress lines
        pipe, proc.stderr = proc.stderr, None  # communicate() leaves it to the thread
        pump = threading.Thread(target=_pump, args=(pipe, err_lines, progress), daemon=True)
        pump.start()
    try:
        out, err = proc.communicate(timeout=None if timeout is None else timeout + GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group (started above)
        out, err = proc.communicate()
        raise RunFailed(f"{run.label or 'job'} ran past {timeout} s: {display_command(run, timeout)}") from None
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if pump is not None:
        pump.join(timeout=10)
        err = "".join(err_lines)
    seconds = time.perf_counter() - t0
    out, err = out or "", err or ""
    if proc.returncode != 0:
        detail = _tail(err or out)
        raise RunFailed(f"{run.label or 'job'} failed (exit code {proc.returncode}): "
                        f"{display_command(run, timeout)}" + (f"\n{detail}" if detail else ""))
    result = None
    if run.json_path is not None:
        try:
            result = json.loads(Path(run.json_path).read_text())
        except (OSError, ValueError) as e:
            raise RunFailed(f"{run.label or 'job'} wrote no readable JSON to {run.json_path}: {e}") from None
    return Outcome(run, proc.returncode, seconds, out, err, result)


def results_list(obj: Any) -> list[dict[str, Any]]:
    """A command's JSON as a list of result objects (one scheme writes an object, several a list)."""
    if obj is None:
        return []
    return list(obj) if isinstance(obj, list) else [obj]


def scheme_option_args(per_scheme: Mapping[str, Mapping[str, Any]], flags: Mapping[str, str] | None = None,
                       kinds: Mapping[str, type] | None = None) -> list[str]:
    """Command-line words for set scheme options (``{"cltk": {"beta": 0.1}}`` -> ``--beta 0.1``).

    An option shared by several schemes is written once.
    """
    words: list[str] = []
    done: set[str] = set()
    for opts in per_scheme.values():
        for name, value in opts.items():
            if value is None or name in done:
                continue
            done.add(name)
            flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
            if (kinds or {}).get(name) is bool or isinstance(value, bool):
                if value:
                    words.append(flag)
            else:
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


__all__ += ["results_list", "scheme_option_args"]
