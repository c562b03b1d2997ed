"""Generating one results table: run its commands (bounded in time), load their JSON results, render,
and write ``NAME.md`` with its provenance header.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .framework import REPO, TABLES, Run, _SCRUB_DIR
from .provenance import display, git_commit, header, machine_info


class RunError(RuntimeError):
    """A command of a table failed or ran past its time limit."""


def _execute(run: Run, *, repo: Path, out_dir: str, python: str, env: dict[str, str], timeout: float,
             echo: Callable[[str], None]) -> None:
    argv = run.argv(python, out_dir)
    full_env = dict(os.environ, **env, **run.env)
    full_env.setdefault("PYTHONPATH", str(repo))
    if run.emucluster is not None:
        full_env["PYTHON"] = python
    for key in ("PMI_RANK", "PMI_SIZE", "PMI_FD", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        full_env.pop(key, None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=repo, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RunError(f"ran past {timeout:.0f} s: {' '.join(argv)}") from None
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if proc.returncode != 0:
        tail = "\n".join((output or "").strip().splitlines()[-15:])
        raise RunError(f"exit code {proc.returncode}: {' '.join(argv)}\n{tail}")
    echo(f"  done in {time.perf_counter() - t0:.0f} s")


def _load_results(out_dir: Path, runs: Sequence[Run]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for run in runs:
        res[run.label] = json.loads((out_dir / f"{run.label}.json").read_text())
        links = out_dir / f"{run.label}-links.json"
        if run.link_stats and links.exists():
            try:
                res[run.label + "-links"] = json.loads(links.read_text())
            except ValueError:
                pass
    return res


def generate(name: str, *, quick: bool = False, out_dir: str | os.PathLike, repo: str | os.PathLike | None = None,
             python: str = sys.executable, timeout: float | None = None, machine: dict[str, Any] | None = None,
             echo: Callable[[str], None] = print, keep_json: str | os.PathLike | None = None) -> Path:
    """Run table ``name``'s commands and write ``out_dir/NAME.md``; returns its path."""
    if name not in TABLES:
        raise ValueError(f"unknown results table {name!r}; tables: {', '.join(TABLES)}")
    table = TABLES[name]
    why = table.unavailable()
    if why:
        raise RunError(f"{name}: cannot run here: {why}")
    repo = Path(repo) if repo is not None else REPO
    runs = table.runs(quick)
    env = {"OMP_NUM_THREADS": "1", **table.env(quick)}
    if timeout is None:
        timeout = 300 if quick else 1800
    commit = git_commit(repo)
    machine = machine if machine is not None else machine_info(python)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpisparse-docs-") as tmp:
        _SCRUB_DIR[:] = [tmp]
        try:
            for run in runs:
                echo(f"$ {display(run, env)}")
                _execute(run, repo=repo, out_dir=tmp, python=python, env=env, timeout=timeout, echo=echo)
            results = _load_results(Path(tmp), runs)
            if keep_json is not None:  # the runs' result objects, e.g. to record a test fixture
                Path(keep_json).mkdir(parents=True, exist_ok=True)
                for label, obj in results.items():
                    (Path(keep_json) / f"{name}--{label}.json").write_text(json.dumps(obj, indent=1) + "\n")
            body = table.render(results, quick)
        finally:
            _SCRUB_DIR[:] = []
    seconds = time.perf_counter() - t0
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    text = header(table, quick=quick, commit=commit, date=date, machine=machine,
                  commands=[display(r, env) for r in runs], seconds=seconds) + "\n" + body.rstrip() + "\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    tmp_path = path.with_name(path.name + ".tmp")
    tmp_path.write_text(text)
    os.replace(tmp_path, path)
    return path
