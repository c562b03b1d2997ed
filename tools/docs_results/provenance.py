"""The provenance header of a results file (commands, commit, date, machine) and the parsing of generated
files (their header fields and Markdown tables).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Sequence

from .framework import GENERATED_MARK, OUT, Run, Table, _cell


def _run_text(argv: Sequence[str], **kw: Any) -> str:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, check=True, **kw).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def git_commit(repo: str | os.PathLike) -> str:
    """``git rev-parse --short HEAD``, with ``+dirty`` when files other than the documentation differ."""
    head = _run_text(["git", "rev-parse", "--short", "HEAD"], cwd=repo).strip() or "unknown"
    status = _run_text(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs",
                        ":(exclude)README.md"], cwd=repo)
    return head + ("+dirty" if status.strip() else "")


_MACHINE_SCRIPT = r"""
import json, os, platform
info = {"cores": os.cpu_count(), "python": platform.python_version()}
cpu = ""
try:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
except OSError:
    pass
info["cpu"] = cpu or platform.processor() or platform.machine()
try:
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    info["mpi"] = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    info["mpi4py"] = mpi4py.__version__
except Exception as e:
    info["mpi"] = "unavailable (%s)" % type(e).__name__
for mod in ("numpy", "torch"):
    try:
        info[mod] = __import__(mod).__version__
    except Exception:
        info[mod] = "not installed"
print(json.dumps(info))
"""


def machine_info(python: str = sys.executable) -> dict[str, Any]:
    """CPU model, core count, MPI library, Python/mpi4py/NumPy/torch versions (read in a subprocess)."""
    text = _run_text([python, "-c", _MACHINE_SCRIPT])
    try:
        return json.loads(text)
    except ValueError:
        return {"cpu": "unknown", "cores": os.cpu_count(), "mpi": "unknown"}


def _env_prefix(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items()))


def display(run: Run, env: dict[str, str]) -> str:
    """The command as printed in a header: ``ENV python -m mpisparse ... --json OUT/label.json``."""
    words = run.argv("python", OUT)
    env = {**env, **run.env}
    return (_env_prefix(env) + " " if env else "") + " ".join(words)


def header(table: Table, *, quick: bool, commit: str, date: str, machine: dict[str, Any], commands: list[str],
           seconds: float) -> str:
    rows = [
        ("table", f"`{table.name}`"),
        ("regenerate", f"`bin/docs-results --only {table.name}" + (" --quick`" if quick else "`")),
        ("mode", "quick (small sizes, for the tests)" if quick else "default"),
        ("commit", f"`{commit}`"),
        ("date (UTC)", date),
        ("machine", f"{machine.get('cpu', 'unknown')}, {machine.get('cores', '?')} cores"),
        ("MPI", f"{machine.get('mpi', 'unknown')} (mpi4py {machine.get('mpi4py', '?')})"),
        ("software", f"Python {machine.get('python', '?')}, NumPy {machine.get('numpy', '?')}, "
                     f"torch {machine.get('torch', '?')}"),
        ("took", f"{seconds:.0f} s"),
    ]
    lines = [f"{GENERATED_MARK} --only {table.name}; edit tools/docs_results/, not this file -->",
             f"# {table.title}", "", table.about, "", "| provenance | |", "| --- | --- |"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in rows]
    lines += ["", "Commands (`OUT` is the output directory):", "", "```console"]
    lines += [f"$ {c}" for c in commands]
    lines += ["```", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- parsing generated files
def parse_header(text: str) -> dict[str, str]:
    """The provenance fields of a generated results file (the first table, ``| key | value |`` rows)."""
    out: dict[str, str] = {}
    in_table = False
    for line in text.splitlines():
        if line.startswith("| provenance |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0] != "---":
                out[cells[0]] = cells[1] if len(cells) > 1 else ""
    if "```console" in text:
        block = text.split("```console", 1)[1].split("```", 1)[0]
        out["commands"] = "\n".join(line for line in block.splitlines() if line.startswith("$ "))
    return out


def markdown_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(heading, columns, rows)`` of every Markdown table after the provenance header."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    heading = ""
    lines = text.splitlines()
    i = 0
    in_code = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif (not in_code and line.startswith("|") and i + 1 < len(lines)
              and re.fullmatch(r"\|(\s*-+:?\s*\|)+", lines[i + 1].strip())):
            cols = _split_row(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_split_row(lines[i]))
                i += 1
            if cols[:1] != ["provenance"]:
                tables.append((heading, cols, rows))
            continue
        i += 1
    return tables


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def table_columns(text: str) -> list[list[str]]:
    """The column names of every results table in a generated file (the header excluded)."""
    return [cols for _, cols, _ in markdown_tables(text)]
