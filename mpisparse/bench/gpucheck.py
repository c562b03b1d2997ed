"""``bin/gpu-check OUT_DIR``: verify the whole GPU path of a machine in one run.

Installs nothing: assumes a CUDA GPU, a CUDA build of torch and CuPy are
present (and mpisparse importable).  In one run it executes

1. the GPU tests with skips turned into failures (``MPISPARSE_TEST_GPU=1``);
2. ``mpisparse info -n 2`` (rank -> GPU mapping, CUDA-awareness);
3. ``bench select --backend cupy`` on 25M float32 at density 0.001 (threshold
   select vs one read, exact top-k vs ``torch.topk``, ``auto``'s pick);
4. ``bench select --backend cupy --mode deft`` on ResNet-50 layers (DEFT's
   per-rank selection and layer norms vs per-layer ``torch.topk`` and
   ``torch.segment_reduce``);
5. ``bench step -n 2 --device cuda`` on ResNet-50 shapes (every
   data-parallel scheme);
6. ``bench step -n 4 --device cuda --hierarchical`` (2 emulated hosts of 2
   ranks: the two-level collectives on device buffers);
7. ``bench step -n 16`` on the host's cores (each scheme's peak resident
   memory per rank against 4.5 gradient buffers), with the scheme's own
   output and with ``--output gradient``;
8. ``torchrun --nproc-per-node gpu -m mpisparse train --device cuda`` (torch.distributed
   over NCCL: one process per GPU);
9. a short ``train -n 2`` of every data-parallel scheme on the device and on
   the CPU with the same seed (test accuracy within 0.5 points);
10. ``bench select --backend cupy`` over sizes and densities (which exact
    top-k method is faster where: ``cupy_select.AUTO_TABLE``);
11. the fixed cost of a kernel call on 65,536 elements with and without
    CUDA-graph replay, and a replayed call against a fresh one
    (``python -m mpisparse.bench.fixed_cost``);
12. ``bench step -n 2 --device cuda --torch-peer``: the toolkit's topk step
    beside the same exchange in plain PyTorch, per phase;
12b. ``bench overlap -n 2 --device cuda`` (``library-cuda``): what
    ``DistributedOptimizer.step()`` adds beside a local optimizer step and
    one device copy of the gradient, and the overlap on the GPU;
13. with ``MPISPARSE_IMPI_PYTHON`` (the Python of a venv holding mpi4py and
    ``impi-rt``): ``info`` and ``bench step --device cuda`` under Intel MPI
    with ``I_MPI_OFFLOAD=1``: the CUDA-aware run (staging copies 0);

14. with ``MPISPARSE_CUDA_MPI`` (the folder of an unpacked CUDA-aware MPI
    with its ``env.sh``, built by ``bin/build-cuda-mpi``): under that MPI,
    ``info``, the device-path tests with device buffers handed to MPI, and
    ``bench step --device cuda`` staged and CUDA-aware side by side.

The report opens with the GPU floor's table (issue 47): for each of its rows
measured, target, met (:mod:`.gpucheck_floor`).  ``--floor`` runs only the
checks that table needs, within one 10-minute device call.

and writes ``OUT_DIR/gpu-check.json`` and ``OUT_DIR/gpu-check.md``: the
device, driver, CUDA, MPI, commit and date, each command with its exit code
and time, and each target met or not.  Each command's own JSON and its whole
output (``NAME.log``) stay in ``OUT_DIR``.  ``--only`` runs some checks
(a re-run after a fix), ``--deadline`` skips the checks that would start
after that many seconds (a device lease is short: the report is written
anyway).  About 5 to 10 minutes on one H100.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .gpucheck_floor import floor_table

__all__ = ["Check", "floor_table", "main", "plan", "summarise", "to_markdown"]

#: accuracy (percentage points) a GPU run of a scheme may differ from the CPU run of the same seed
ACCURACY_POINTS = 0.5
#: peak resident memory per rank, in gradient buffers, a scheme may take (the performance issue's target)
MEMORY_MULTIPLE = 4.5
#: every data-parallel scheme: each runs a device-resident ``bench step`` and trains on the device and the CPU
STEP_SCHEMES = ("dense", "topk", "randomk", "threshold", "cltk", "deft", "dct", "gtopk", "dgc", "powersgd", "oktopk")
TRAIN_SCHEMES = STEP_SCHEMES
#: the memory check's order with the update written into the gradient: dgc (4 buffers) first
MEMORY_ORDER = ("dgc", *(s for s in STEP_SCHEMES if s != "dgc"))
HIER_SCHEMES = ("dense", "cltk", "topk")
SWEEP_SIZES = "65536,262144,1000000,4000000,25000000"
SWEEP_DENSITIES = "0.0001,0.001,0.01,0.1,0.3"


@dataclass
class Check:
    """One command of the check: what it runs, and (after running) how it ended."""

    name: str
    argv: list[str]
    json: str | None = None
    timeout: int = 300
    env: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    tail: str = ""
    skipped: str = ""


#: Intel MPI with its NVIDIA device-buffer support on (mpisparse/mpi/vendor.py)
IMPI_ENV = {"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "cuda"}
#: the checks the floor table reads (``--floor``), in the order they run
FLOOR_CHECKS = ("info", "select", "fixed-cost", "select-deft", "library-cuda", "cuda-mpi-info", "cuda-mpi-tests",
                "cuda-mpi-step", "cuda-mpi-step-staged", "gpu-tests")
#: the command prefix that runs a command under the MPI in ``$MPISPARSE_CUDA_MPI`` (its env.sh sets PATH,
#: LD_LIBRARY_PATH and OPAL_PREFIX)
UNDER_CUDA_MPI = ["bash", "-c", '. "$MPISPARSE_CUDA_MPI/env.sh" && exec "$@"', "under-cuda-mpi"]


def plan(out: Path, *, python: str = sys.executable, epochs: int = 3, impi_python: str | None = None,
         cuda_mpi: str | None = None) -> list[Check]:
    """The commands of a check writing into ``out`` (a pure function: tests read it).

    ``cuda_mpi``: the folder of an unpacked CUDA-aware MPI (``bin/build-cuda-mpi``); without it the
    checks under that MPI are skipped.

    ``impi_python``: the Python of a venv with mpi4py on Intel MPI (``pip install
    mpi4py impi-rt`` and this package); without it the Intel MPI checks are skipped.
    """
    ms = [python, "-m", "mpisparse"]
    j = lambda name: str(out / f"{name}.json")  # noqa: E731
    schemes = lambda names: [a for s in names for a in ("--scheme", s)]  # noqa: E731
    checks = [
        Check("gpu-tests", [python, "-m", "pytest", "tests", "-m", "gpu", "-q", "-rs"], env={"MPISPARSE_TEST_GPU": "1"},
              timeout=240),
        Check("info", [*ms, "info", "-n", "2", "--json", j("info")], json=j("info"), timeout=60),
        Check("select", [*ms, "bench", "select", "--backend", "cupy", "--size", "25000000", "--density", "0.001",
                         "--repeats", "20", "--json", j("select")], json=j("select"), timeout=150),
        Check("select-deft", [*ms, "bench", "select", "--backend", "cupy", "--mode", "deft", "--model", "resnet50",
                              "--worlds", "1,2,4,8", "--density", "0.01", "--json", j("select-deft")],
              json=j("select-deft"), timeout=150),
        # issue 36: a call's fixed cost, graph replay against plain launches, replay equal to a fresh call
        Check("fixed-cost", [python, "-m", "mpisparse.bench.fixed_cost", "--json", j("fixed-cost")],
              json=j("fixed-cost"), timeout=120),
        # the toolkit's topk step beside the same exchange written in plain PyTorch, same GPU, same run
        Check("step-torch-peer", [*ms, "bench", "step", "-n", "2", "--device", "cuda", "--model", "resnet50",
                                  "--scheme", "topk", "--torch-peer", "--density", "0.01", "--iters", "10",
                                  "--json", j("step-torch-peer")], json=j("step-torch-peer"), timeout=180),
        # issue 34 item 6 on the GPU path: what DistributedOptimizer.step() adds beside a local step and one copy
        Check("library-cuda", [*ms, "bench", "overlap", "-n", "2", "--device", "cuda", "--model", "resnet18",
                               "--scheme", "dense", "--scheme", "topk", "--layerwise", "--iters", "10",
                               "--warmup", "3", "--json", j("library-cuda")], json=j("library-cuda"), timeout=180),
        Check("step", [*ms, "bench", "step", "-n", "2", "--device", "cuda", "--model", "resnet50",
                       *schemes(STEP_SCHEMES), "--density", "0.01", "--iters", "10", "--json", j("step")],
              json=j("step"), timeout=240),
        Check("step-hier", [*ms, "bench", "step", "-n", "4", "--device", "cuda", "--hierarchical", "--model",
                            "resnet50", *schemes(HIER_SCHEMES), "--density", "0.01", "--iters", "5",
                            "--json", j("step-hier")],
              json=j("step-hier"), env={"MPISPARSE_RANKS_PER_HOST": "2"}, timeout=150),
        # the host side of a GPU machine: 16 ranks on its 16 cores, each scheme's peak resident memory
        Check("step-cpu-16", [*ms, "bench", "step", "-n", "16", "--model", "resnet50", *schemes(STEP_SCHEMES),
                              "--density", "0.001", "--iters", "3", "--warmup", "1", "--json", j("step-cpu-16")],
              json=j("step-cpu-16"), env={"OMP_NUM_THREADS": "1"}, timeout=300),
        # the same with the update written into the gradient (as DistributedOptimizer does); dgc first: the
        # scheme nearest the target, measured before other schemes' loops are loaded in the job
        Check("step-cpu-16-gradient", [*ms, "bench", "step", "-n", "16", "--model", "resnet50", "--output", "gradient",
                                       *schemes(MEMORY_ORDER), "--density", "0.001", "--iters", "3", "--warmup", "1",
                                       "--json", j("step-cpu-16-gradient")],
              json=j("step-cpu-16-gradient"), env={"OMP_NUM_THREADS": "1"}, timeout=300),
        # torch.distributed instead of MPI, on the GPUs
        Check("torchrun-cuda", [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "gpu",
                                "-m", "mpisparse", "train", "--device", "cuda", "--scheme", "topk", "--density",
                                "0.01", "--epochs", str(epochs), "--seed", "0", "--json", j("torchrun-cuda")],
              json=j("torchrun-cuda"), timeout=150),
    ]
    # a CUDA-aware MPI: Intel MPI with offload, the decision it reaches, and the device step without staging
    ipy = impi_python or "python-of-an-impi-venv"
    why = "" if impi_python else "skipped: set MPISPARSE_IMPI_PYTHON to a venv's python with mpi4py and impi-rt"
    checks += [
        Check("impi-info", [ipy, "-m", "mpisparse", "info", "-n", "2", "--json", j("impi-info")], json=j("impi-info"),
              env=dict(IMPI_ENV), timeout=90, skipped=why),
        Check("impi-step", [ipy, "-m", "mpisparse", "bench", "step", "-n", "2", "--device", "cuda", "--cuda-aware",
                            "--model", "resnet50", "--scheme", "dense", "--scheme", "topk", "--density", "0.01",
                            "--iters", "5", "--json", j("impi-step")], json=j("impi-step"), env=dict(IMPI_ENV),
              timeout=180, skipped=why),
    ]
    # the carried CUDA-aware MPI: its own answer, the device-path tests with device buffers handed to MPI,
    # and the same device step staged and CUDA-aware, side by side
    why = "" if cuda_mpi else "skipped: set MPISPARSE_CUDA_MPI to the folder of bin/build-cuda-mpi's unpacked MPI"
    env = {"MPISPARSE_CUDA_MPI": cuda_mpi or ""}
    step = [*ms, "bench", "step", "-n", "2", "--device", "cuda", "--model", "resnet50", "--scheme", "dense",
            "--scheme", "topk", "--density", "0.01", "--iters", "5"]
    checks += [
        Check("cuda-mpi-info", [*UNDER_CUDA_MPI, *ms, "info", "-n", "2", "--json", j("cuda-mpi-info")],
              json=j("cuda-mpi-info"), env=env, timeout=90, skipped=why),
        Check("cuda-mpi-tests", [*UNDER_CUDA_MPI, python, "-m", "pytest", "tests/test_gpu_comm.py",
                                 "tests/test_device_path.py", "-q", "-rs", "-n", "0"],
              env={**env, "MPISPARSE_CUDA_AWARE": "1", "MPISPARSE_TEST_GPU": "1"}, timeout=180, skipped=why),
        Check("cuda-mpi-step", [*UNDER_CUDA_MPI, *step, "--cuda-aware", "--json", j("cuda-mpi-step")],
              json=j("cuda-mpi-step"), env=env, timeout=150, skipped=why),
        Check("cuda-mpi-step-staged", [*UNDER_CUDA_MPI, *step, "--no-cuda-aware", "--json", j("cuda-mpi-step-staged")],
              json=j("cuda-mpi-step-staged"), env=env, timeout=150, skipped=why),
    ]
    for s in TRAIN_SCHEMES:
        for device in ("cuda", "cpu"):
            name = f"train-{device}-{s}"
            checks.append(Check(name, [*ms, "train", "-n", "2", "--device", device, "--scheme", s, "--density",
                                       "0.01", "--epochs", str(epochs), "--seed", "0", "--json", j(name)],
                                json=j(name), timeout=150))
    # issue 36 item 4: time to accuracy with the whole step on the GPU (the quick form: dense-opt against topk)
    checks.append(Check("tta-cuda", [*ms, "bench", "tta", "-n", "2", "--device", "cuda", "--quick", "--scheme",
                                     "dense-opt", "--scheme", "topk", "--json", j("tta-cuda")],
                        json=j("tta-cuda"), timeout=300))
    # which exact top-k is faster where: the rows of cupy_select.AUTO_TABLE (measured on an H200 already)
    checks.append(Check("select-sweep", [*ms, "bench", "select", "--backend", "cupy", "--sizes", SWEEP_SIZES,
                                         "--densities", SWEEP_DENSITIES, "--repeats", "10",
                                         "--json", j("select-sweep"), "--csv", str(out / "select-sweep.csv")],
                        json=j("select-sweep"), timeout=240))
    return checks


def _load(check: Check) -> Any:
    if check.json and Path(check.json).is_file():
        return json.loads(Path(check.json).read_text())
    return None


def _accuracy(result: Any) -> float | None:
    res = result[0] if isinstance(result, list) else result
    try:
        return 100.0 * float(res["metrics"]["final"]["test_accuracy"])
    except (TypeError, KeyError):
        return None


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, list) and x else x


def _as_list(x: Any) -> list:
    return x if isinstance(x, list) else [x] if x else []


def summarise(checks: Sequence[Check], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target: ``{"target", "measured", "met"}`` (``met`` None when its command gave no result)."""
    rows: list[dict[str, Any]] = []
    for c in checks:
        if c.name in ("gpu-tests", "info"):
            rows.append({"target": f"{c.name}: exit 0", "measured": f"exit {c.returncode}",
                         "met": None if c.returncode is None else c.returncode == 0})
    sel = results.get("select")
    sel = sel[0] if isinstance(sel, list) and sel else sel
    if isinstance(sel, dict):
        for name, met in sel.get("targets", {}).items():
            key = name.split(" ")[0]
            rows.append({"target": f"select: {name}", "measured": f"{sel.get('ratios', {}).get(key, float('nan')):.2f}",
                         "met": bool(met)})
        auto = sel.get("auto", {})
        if auto:
            rows.append({"target": "select: auto picks the fastest top-k",
                         "measured": f"picked {auto.get('picked')}, fastest {auto.get('fastest')}",
                         "met": bool(auto.get("auto_is_fastest"))})
        checks_ok = sel.get("checks", {})
        if checks_ok:
            rows.append({"target": "select: every top-k path exact", "measured": ", ".join(
                f"{k} {'ok' if v else 'WRONG'}" for k, v in checks_ok.items()), "met": all(checks_ok.values())})
    for r in results.get("select-deft") or []:
        w = r.get("world_size")
        if r.get("target_select_ms") is not None:
            landed = 1e3 * float(r["deft_max_seconds"])
            rows.append({"target": f"deft: selection W={w} <= {r['target_select_ms']:g} ms",
                         "measured": f"{landed:.3f} ms (per-layer torch.topk "
                                     f"{r.get('peer_topk_ms') or float('nan'):.3f})",
                         "met": landed <= r["target_select_ms"]})
        if r.get("target_norms_ms") is not None and w == 1:
            rows.append({"target": f"deft: layer norms <= {r['target_norms_ms']:g} ms",
                         "measured": f"{r['norms_ms']:.3f} ms (torch.segment_reduce "
                                     f"{r.get('peer_norms_ms') or float('nan'):.3f})",
                         "met": r["norms_ms"] <= r["target_norms_ms"]})
    for name, schemes in (("step", STEP_SCHEMES), ("step-hier", HIER_SCHEMES)):
        step = results.get(name)
        if step is not None:
            step = step if isinstance(step, list) else [step]
            rows.append({"target": f"{name}: every scheme ran on the device",
                         "measured": ", ".join(f"{r['scheme']} {1e3 * r['step_seconds']:.2f} ms" for r in step),
                         "met": {r["scheme"] for r in step} == set(schemes)})
    for name in ("step-cpu-16", "step-cpu-16-gradient"):
        mem = results.get(name)
        for r in (mem if isinstance(mem, list) else [mem] if mem else []):
            x = r["peak_rss_bytes_per_rank"] / r["gradient_buffer_bytes"]
            rows.append({"target": f"{name}: {r['scheme']} peak RSS per rank <= {MEMORY_MULTIPLE:g}x the buffer",
                         "measured": f"{x:.2f}x", "met": x <= MEMORY_MULTIPLE})
    acc = _accuracy(results.get("torchrun-cuda"))
    rows.append({"target": "torchrun -m mpisparse train --device cuda: runs", "measured": "-" if acc is None else
                 f"test accuracy {acc:.2f}%", "met": None if acc is None else True})
    for s in TRAIN_SCHEMES:
        gpu, cpu = _accuracy(results.get(f"train-cuda-{s}")), _accuracy(results.get(f"train-cpu-{s}"))
        rows.append({"target": f"train --scheme {s}: the GPU run within {ACCURACY_POINTS} points of the CPU run "
                               "(same seed)",
                     "measured": "-" if gpu is None or cpu is None else f"{gpu:.2f}% vs {cpu:.2f}%",
                     "met": None if gpu is None or cpu is None else abs(gpu - cpu) <= ACCURACY_POINTS})
    return rows


def to_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = ["# GPU check", "", f"`{report['command']}`", "",
             "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in m.items()]
    verdict = {True: "yes", False: "**no**", None: "no result"}
    if report.get("issue"):
        verdict["yardstick"] = "(yardstick)"
        lines += ["", "## The GPU floor (issue 47)", "", "| row | measured | target | met |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['row']} | {r['measured']} | {r['target']} | {verdict[r['met']]} |" for r in report["issue"]]
    lines += ["", "## Targets", "", "| target | measured | met |", "| --- | --- | --- |"]
    lines += [f"| {r['target']} | {r['measured']} | {verdict[r['met']]} |" for r in report["targets"]]
    lines += ["", "## Commands", "", "| step | exit | seconds | command |", "| --- | --- | --- | --- |"]
    lines += [f"| {c['name']} | {c.get('skipped') or c['returncode']} | {c['seconds']:.1f} | "
              f"`{' '.join(c['argv'][1:])}` |" for c in report["checks"]]
    return "\n".join(lines) + "\n"


def _capture(argv: Sequence[str]) -> str:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, Any]:
    """Device, driver, CUDA, MPI, commit and date (what the report is about)."""
    info: dict[str, Any] = {"date (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}
    info["device"] = _capture(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    info["driver"] = _capture(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    try:
        import torch

        info["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
    except ImportError:
        info["torch"] = "missing"
    try:
        import cupy

        info["cupy"] = f"{cupy.__version__} (CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()})"
    except Exception as e:  # noqa: BLE001 - reported, not fatal here
        info["cupy"] = f"unusable: {e}"
    info["mpiexec"] = (_capture([_mpiexec(), "--version"]).splitlines() or ["unknown"])[0]
    info["mpi"] = _capture([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import "
                            "MPI; print(MPI.Get_library_version().splitlines()[0])"]).replace("\0", "")  # Open MPI ends it with NUL
    # a copy of the tree whose .git is missing or stale (a device lease): the caller names the commit
    info["commit"] = os.environ.get("MPISPARSE_COMMIT") or _capture(
        ["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", "HEAD"])
    return info


def _mpiexec() -> str:
    from ..mpi.launch import find_mpiexec

    try:
        return find_mpiexec()
    except RuntimeError:
        return "mpiexec"


def _gpu_missing() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as e:  # noqa: BLE001
        return f"CuPy is not usable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch has no CUDA device (a CPU build of torch?)"
    except ImportError:
        return "torch is not installed"
    return None


def repo_root() -> Path:
    """The checkout the checks run in (``pytest tests`` and ``python -m`` resolve from there; run from inside
    the package, ``import torch`` would find ``mpisparse/torch``)."""
    return Path(__file__).resolve().parents[2]


def run_check(c: Check, cwd: Path) -> tuple[int, float, str]:
    """Run one check's command: its exit code (124 past its timeout), seconds and whole output.

    The command runs in its own process group, killed whole at the timeout: an
    ``mpiexec`` killed alone can leave ranks that hold the output pipe open.
    """
    t0 = time.monotonic()
    p = subprocess.Popen(c.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                         env=dict(os.environ, **c.env), start_new_session=True)
    try:
        output, _ = p.communicate(timeout=c.timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:
            output, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process that left the group still holds the pipe
            output = ""
        code, output = 124, f"{output}\ntimed out after {c.timeout} s"
    return code, time.monotonic() - t0, output


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bin/gpu-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory for gpu-check.json, gpu-check.md and each command's JSON")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each short train run (default 3)")
    ap.add_argument("--only", default="", help="comma-separated names of the checks to run (default: all)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="skip the checks that would start more than this many seconds after the first")
    ap.add_argument("--floor", action="store_true",
                    help="only the checks of the GPU floor's table (issue 47), with --deadline 480 unless given")
    args = ap.parse_args(argv)
    missing = _gpu_missing()
    if missing:
        print(f"gpu-check: {missing}; this check needs a CUDA GPU with torch (CUDA build) and CuPy", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checks = plan(out, epochs=args.epochs, impi_python=os.environ.get("MPISPARSE_IMPI_PYTHON") or None,
                  cuda_mpi=os.environ.get("MPISPARSE_CUDA_MPI") or None)
    names = [n for n in args.only.split(",") if n]
    if args.floor:
        names = names or list(FLOOR_CHECKS)
        args.deadline = 480.0 if args.deadline is None else args.deadline
    unknown = sorted(set(names) - {c.name for c in checks})
    if unknown:
        print(f"gpu-check: --only names {', '.join(unknown)}; the checks are "
              f"{', '.join(c.name for c in checks)}", file=sys.stderr)
        return 2
    if names:  # in the order named (--floor's: the table's rows first, the whole GPU suite last)
        checks = sorted((c for c in checks if c.name in names), key=lambda c: names.index(c.name))
    root = repo_root()
    results: dict[str, Any] = {}
    start = time.monotonic()
    for c in checks:
        if c.skipped:
            print(f"$ {c.name}: {c.skipped}", flush=True)
            continue
        if args.deadline is not None and time.monotonic() - start > args.deadline:
            c.skipped = f"skipped: past --deadline {args.deadline:g} s"
            print(f"$ {c.name}: {c.skipped}", flush=True)
            continue
        print(f"$ {' '.join(c.argv)}", flush=True)
        c.returncode, c.seconds, output = run_check(c, root)
        c.tail = output[-3000:]
        (out / f"{c.name}.log").write_text(output)
        print(f"  exit {c.returncode} in {c.seconds:.1f} s", flush=True)
        results[c.name] = _load(c)
    report = {"command": " ".join(["bin/gpu-check", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine(), "issue": floor_table(results), "targets": summarise(checks, results),
              "checks": [asdict(c) for c in checks]}
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    md = to_markdown(report)
    (out / "gpu-check.md").write_text(md)
    print(md)
    return 0 if all(r["met"] for r in report["targets"] if r["target"].endswith("exit 0")) else 1
