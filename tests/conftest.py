"""Shared test helpers: bounded MPI launches.

Every MPI test runs its own ``mpiexec`` job with ``MPIEXEC_TIMEOUT`` set and
a subprocess timeout on top, so one failing or hung rank ends that job and
can never hang the suite (a plain ``python script.py`` under mpiexec would
leave the other ranks waiting when one raises).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tempfile
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mpisparse.mpi.launch import build_mpiexec_command, find_mpiexec, has_remote_shell, launcher_flavor

HERE = Path(__file__).parent
# the maintainers' tools (tools/docs_results/) are outside the installed package
sys.path.insert(0, str(HERE.parent / "tools"))
MPI_TIMEOUT = int(os.environ.get("MPISPARSE_TEST_MPI_TIMEOUT", "120"))
# the suite's emulated clusters (reproduce, bench scaling, docs tables) use their own instance, so a
# cluster someone left up with the default instance 0 (another rate, fewer hosts) cannot fail them
os.environ.setdefault("EMUCLUSTER_INSTANCE", "96")


def mpi_run(n: int, args: list[str], *, module: bool = False, timeout: int = MPI_TIMEOUT,
            env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python SCRIPT args`` (or ``python -m mpisparse args``) on ``n`` ranks, bounded in time."""
    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(n, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=timeout, remote_shell=has_remote_shell())
    argv = plan.argv[: plan.argv.index(sys.executable)]
    # scripts run under ``python -m mpi4py`` so an exception on one rank aborts the job
    argv += [sys.executable, "-m", "mpisparse", *args] if module else [sys.executable, "-m", "mpi4py", *args]
    full_env = dict(os.environ, **plan.env, OMP_NUM_THREADS="1", **(env or {}))
    # a script's own folder replaces the working directory on sys.path: name the checkout explicitly
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), full_env.get("PYTHONPATH")) if p)
    full_env.pop("PMI_RANK", None)
    proc = launch(argv, capture_output=True, text=True, timeout=timeout + 30, env=full_env, cwd=HERE.parent)
    if check and proc.returncode != 0:
        raise AssertionError(f"MPI job failed ({proc.returncode}): {' '.join(argv)}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


#: what a launcher prints when it fails to start before any rank runs (seen in CI: Open MPI 5's
#: mpiexec, intermittently, exit 213); a job that failed so is launched once more
LAUNCHER_START_FAILURES = ("The PMIx server's listener thread failed to start",)


def launcher_failed_to_start(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode != 0 and any(m in (proc.stderr or "") for m in LAUNCHER_START_FAILURES)


def launch(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kw)`` of a command line that starts ``mpiexec`` (stderr captured), launched once
    more when the launcher itself failed to start, before any rank ran (:data:`LAUNCHER_START_FAILURES`)."""
    for _ in range(2):
        proc = subprocess.run(cmd, **kw)
        if not launcher_failed_to_start(proc):
            break
    return proc


def mpiexec_prefix(timeout: int = MPI_TIMEOUT) -> tuple[list[str], dict[str, str]]:
    """``mpiexec`` and its launcher's options (root, oversubscription, time bound), without ``-n``,
    for tests that write their own command line (MPMD, plain python); plus the environment to add."""
    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(1, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=timeout, remote_shell=has_remote_shell())
    argv = plan.argv[: plan.argv.index(sys.executable)]
    del argv[1:3]  # "-n", "1"
    return argv, dict(plan.env)


class GatherComm:
    """``allgather_obj`` of a world whose other ranks hold ``others`` (this rank's object first), for unit
    tests of a reduction over ranks without MPI."""

    def __init__(self, others):
        self.others = others

    def allgather_obj(self, obj):
        return [obj, *self.others]


class SelfComm:
    """A one-rank stand-in for the communicator in unit tests (no MPI): every collective returns this
    rank's own data; device arrays pass through (``x.copy()`` on their own module)."""

    rank, size, bytes_sent = 0, 1, 0

    def __init__(self):
        self.staging = {"d2h": 0, "h2d": 0, "d2h_bytes": 0, "h2d_bytes": 0}

    def barrier(self):
        pass

    def bcast(self, x, root=0):
        return x

    def allgatherv(self, x, counts=None):
        return x.copy(), np.array([x.size])

    def allreduce(self, x, out=None, *, op="sum"):
        if out is None:
            return x.copy() if hasattr(x, "copy") else np.array(x, copy=True)
        if out is not x:
            out[...] = x
        return out

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj


def mpi_script(name: str) -> str:
    return str(HERE / "mpi" / name)


#: (ranks, extra arguments) of the runs of a reference script: 1-4 ranks, and 3 with the collective checks on
SCRIPT_RUNS = [(1, ()), (2, ()), (3, ()), (4, ()), (3, ("--check",))]


def rank_script(name: str, ranks: int, *args: str, label: str | None = None, **kw) -> subprocess.CompletedProcess:
    """Run tests/mpi/check_NAME.py on ``ranks`` ranks; it must report ``LABEL OK on RANKS ranks`` (LABEL: NAME)."""
    out = mpi_run(ranks, [mpi_script(f"check_{name}.py"), *args], **kw)
    assert f"{label or name} OK on {ranks} ranks" in out.stdout, out.stdout[-2000:]
    return out


# --------------------------------------------------------------------------- many cases in one job
#: the seconds one case of :func:`rank_case` may run before its job is ended (``faulthandler`` on each rank)
CASE_TIMEOUT = int(os.environ.get("MPISPARSE_TEST_CASE_TIMEOUT", "90"))


@dataclass(frozen=True)
class Case:
    """One rank script with its arguments: ``tests/mpi/check_NAME.py ARGS``."""

    name: str
    args: tuple[str, ...] = ()
    timeout: int = CASE_TIMEOUT

    @property
    def id(self) -> str:
        return " ".join((self.name, *self.args))


@dataclass
class CaseOutcome:
    ok: bool
    stdout: str = ""
    error: str = ""
    seconds: float = 0.0


def _read_case_logs(out: Path, ranks: int) -> dict[str, dict[int, dict]]:
    """``{case id: {rank: its last record}}`` from the ranks' logs (see tests/mpi/run_cases.py)."""
    seen: dict[str, dict[int, dict]] = {}
    for r in range(ranks):
        path = out / f"rank{r}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by the job's end
                continue
            if seen.setdefault(rec["case"], {}).get(r, {}).get("event") != "fail":  # a failure is final
                seen[rec["case"]][r] = rec
    return seen


def _job_of_cases(cases: list[Case], ranks: int, args: tuple[str, ...], tmp: Path,
                  env: dict | None) -> tuple[dict[str, CaseOutcome], subprocess.CompletedProcess, Path]:
    """One bounded job running ``cases`` in order; the outcome of each case that has one on every rank."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    spec = {"out": str(out), "cases": [{"id": c.id, "script": mpi_script(f"check_{c.name}.py"),
                                        "args": [*c.args, *args], "timeout": c.timeout} for c in cases]}
    (out / "spec.json").write_text(json.dumps(spec))
    try:
        proc = mpi_run(ranks, [mpi_script("run_cases.py"), str(out / "spec.json")], check=False, env=env,
                       timeout=sum(c.timeout for c in cases) + 30)
    except subprocess.TimeoutExpired as exc:  # past MPIEXEC_TIMEOUT and the subprocess's own bound
        proc = subprocess.CompletedProcess(exc.cmd, -9, str(exc.stdout or ""), str(exc.stderr or ""))
    outcomes = {}
    for cid, by_rank in _read_case_logs(out, ranks).items():
        failed = [rec for rec in by_rank.values() if rec["event"] == "fail"]
        if failed:
            outcomes[cid] = CaseOutcome(False, failed[0].get("stdout", ""), failed[0]["error"])
        elif len(by_rank) == ranks and all(rec["event"] == "ok" for rec in by_rank.values()):
            rec0 = by_rank[0]
            outcomes[cid] = CaseOutcome(True, rec0["stdout"], seconds=max(r["seconds"] for r in by_rank.values()))
    return outcomes, proc, out


def _job_ended_during(case: Case, ranks: int, proc: subprocess.CompletedProcess, out: Path) -> str:
    """What is known of a case that has no outcome: the job ended (or hung) while it ran."""
    hangs = [p.read_text() for p in sorted(out.glob("rank*.hang")) if "most recent call first" in p.read_text()]
    return (f"case {case.id!r} on {ranks} ranks has no result: its job ended with {proc.returncode}"
            + (f"\n--- stacks of the ranks past the time limit\n{hangs[0][-6000:]}" if hangs else "")
            + f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def run_cases(cases: list[Case], ranks: int, args: tuple[str, ...] = (),
              env: dict | None = None) -> dict[str, CaseOutcome]:
    """Run every case of ``cases`` on ``ranks`` ranks, in as few jobs as it takes; each one's outcome.

    One job runs them in order.  A failing case is named by its rank (traceback) and ends the job; the
    cases after it run in a new job.  A case during which the job ended without a report of its own (a
    hang past the case's time limit, a crash, a rank killed) is run again alone, so that the failure is
    its own and not its neighbours'; if it passes alone it still fails, with both reports.
    """
    outcomes: dict[str, CaseOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="mpisparse-cases-") as tmp:
        pending = list(cases)
        while pending:
            got, proc, out = _job_of_cases(pending, ranks, args, Path(tmp), env)
            outcomes.update(got)
            rest = [c for c in pending if c.id not in outcomes]
            if not rest:
                break
            if any(not o.ok for o in got.values()):  # a case that failed ended the job: run the others on
                pending = rest
                continue
            suspect, ran_alone = rest[0], len(pending) == 1
            pending = rest[1:]
            report = _job_ended_during(suspect, ranks, proc, out)
            if not ran_alone:
                alone, proc, out = _job_of_cases([suspect], ranks, args, Path(tmp), env)
                if suspect.id in alone:
                    outcomes[suspect.id] = alone[suspect.id] if not alone[suspect.id].ok else CaseOutcome(
                        False, error=f"passed alone, but not after the cases before it in one job:\n{report}")
                    continue
                report = _job_ended_during(suspect, ranks, proc, out)
            outcomes[suspect.id] = CaseOutcome(False, error=report)
    return outcomes


_CASE_RESULTS: dict[tuple, dict[str, CaseOutcome]] = {}

#: Rank scripts that share jobs, by the rank counts each runs at: ``rank_case(case, ranks, family=F)`` runs
#: every case of family F at that rank count in one job (the first test of them to run starts it).
#: Those without torch, the reference checks of every scheme first:
NUMPY_CASES = {
    **{name: (1, 2, 3, 4) for name in ("schemes", "cltk", "dct", "deft", "dgc", "gtopk", "comm")},
    ("hierarchy", "one"): (1, 2), ("hierarchy", "pairs"): (3, 4), ("hierarchy", "split"): (4,),
    "ps_comm": (2,), ("ps", "reference", "1"): (3, 4), ("ps", "reference", "2"): (4,),
    ("ps", "shutdown", "1"): (3,), ("ps", "shutdown", "2"): (4,),
    "gpu_comm": (2, 3), "wire_dtype": (3,), "oktopk": (2, 4),
}
#: the same checks with ``--check`` (every collective's counts and dtypes compared across ranks first)
CHECKED_CASES = {name: (3,) for name in ("schemes", "cltk", "dct", "deft", "dgc", "gtopk", "powersgd", "oktopk")}
#: those that train or wrap torch (each rank imports torch once per job)
TORCH_CASES = {"torch_api": (1, 2, 3), "torch_hvd": (2,), "torch_overlap": (1, 2, 3), "torch_wrapper": (1, 2),
               "torch_amp": (1, 2), "rows": (2,),
               "mp_pipeline": (2, 3, 4), "mp_resume": (4,), "reshard": (4,), "ps_resume": (3,),
               ("wire_dtype", "--torch"): (2,), ("powersgd", "torch"): (2,), "localsgd": (1, 2, 3, 4)}


def case_group(family: dict, ranks: int) -> tuple:
    """The cases of ``family`` that run at ``ranks`` ranks, in the family's order."""
    return tuple(case for case, counts in family.items() if ranks in counts)


def _case(spec: str | tuple) -> Case:
    return Case(spec) if isinstance(spec, str) else Case(spec[0], tuple(spec[1:]))


def rank_case(case: str | tuple, ranks: int, *args: str, family: dict | None = None, group: tuple = (),
              label: str | None = None, env: dict | None = None) -> CaseOutcome:
    """Case ``case`` (``NAME`` or ``(NAME, its arguments...)``: tests/mpi/check_NAME.py) on ``ranks`` ranks
    with the job-wide ``args`` (``--check``).  The first call of a ``group`` (cases given the same way,
    ``case`` among them; ``family``: the group is :func:`case_group` of it at ``ranks``) runs all its
    cases in one job (:func:`run_cases`); the others read their outcome.  The case must pass and report
    ``LABEL OK on RANKS ranks`` (LABEL: NAME), as :func:`rank_script` checks of a job of its own."""
    me = _case(case)
    if family is not None:
        group = case_group(family, ranks)
    cases = tuple(_case(g) for g in group) or (me,)
    assert me in cases, f"case {me.id!r} is not in its group {[c.id for c in cases]}"
    key = (cases, ranks, args, tuple(sorted((env or {}).items())))
    if key not in _CASE_RESULTS:
        _CASE_RESULTS[key] = run_cases(list(cases), ranks, args, env)
    outcome = _CASE_RESULTS[key][me.id]
    assert outcome.ok, f"{me.id} on {ranks} ranks {' '.join(args)}: {outcome.error}\n{outcome.stdout[-2000:]}"
    assert f"{label or me.name} OK on {ranks} ranks" in outcome.stdout, outcome.stdout[-2000:]
    return outcome


def bench_step(ranks: int, tmp_path: Path, *args: str, name: str = "bench") -> dict:
    """``mpisparse bench step --model ncf ARGS --json TMP/NAME.json`` on ``ranks`` ranks; its JSON result."""
    path = tmp_path / f"{name}.json"
    mpi_run(ranks, ["bench", "step", "--model", "ncf", *args, "--json", str(path)], module=True)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op torch thread is fastest, and robust on a loaded machine (a module's tests)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def mpirun():
    return mpi_run


# --------------------------------------------------------------------------- the fault-injection suite
FAULTS = HERE / "faults"


#: what launches ranks that wait on each other (a job of ``-n`` ranks, or a launcher): such a module's tests run in
#: the MPI lane whatever it declares
MULTI_RANK = re.compile(r"\b(mpi_run|rank_script|rank_case|run_cases|bench_step|mpiexec_prefix|find_mpiexec)\("
                        r"|\bdef test_\w+\([^)]*\bmpirun\b|[\"']-n[\"']")
#: what in a test module's text says it runs MPI: a launch helper, a launcher, a CLI command on ``-n`` ranks or
#: in a subprocess (a singleton MPI process), mpi4py itself, a communicator opened in the test's own process
MPI_USE = re.compile(MULTI_RANK.pattern + r"|\bopen_comm\(|\bmpi4py\b|[\"']-m[\"'],\s*[\"']mpisparse[\"']")
#: what a module that runs MPI in one process only (``python -m mpisparse`` without ``-n``: a singleton, no rank
#: waits on another, so it takes one core) writes to run in the unit lane
ONE_PROCESS = re.compile(r"^ONE_PROCESS_MPI = True\b", re.M)
#: what says it exercises the compiled loops or their plain NumPy fallback (numba installed or not)
FALLBACK_USE = re.compile(r"\b(numba|compiled|fused|MPISPARSE_FUSED)\b")


@functools.lru_cache(maxsize=None)
def _module_text(path: Path) -> str:
    return path.read_text()


def pytest_collection_modifyitems(config, items):
    """Markers from where a test lives and what its module does.

    - ``faults``: every test under tests/faults/ (``pytest -m faults`` runs only them). The
      fault-injection suite runs each case the way a user meets it: real subprocesses, real
      ``mpiexec``, real signals and real files, each case bounded in time, asserting what must hold
      afterwards (exit code, the one-line message, no process of the job left, files intact).
    - ``mpi``: every test of a module that runs MPI (:data:`MPI_USE`), besides the tests marked by
      hand. The Open MPI pass of .ci/run runs these; a test that runs MPI without the marker fails
      (:func:`_unmarked_tests_run_no_mpi`), so the pass cannot miss one.
    - ``fallback``: every test of a module that exercises the compiled loops or their NumPy fallback
      (:data:`FALLBACK_USE`): the Open MPI pass, which has no numba, runs these too.
    """
    for item in items:
        path = Path(str(item.fspath))
        if FAULTS in path.parents:
            item.add_marker(pytest.mark.faults)
        text = _module_text(path)
        if MPI_USE.search(text) and item.get_closest_marker("mpi") is None:
            item.add_marker(pytest.mark.mpi)
        if FALLBACK_USE.search(text):
            item.add_marker(pytest.mark.fallback)
    # every MPI test in the MPI lane (:func:`lane_of`), or two of their jobs could share the cores; only a module
    # that runs one MPI process at a time, and says so, in the unit lane
    for path in {Path(str(item.fspath)) for item in items}:
        text = _module_text(path)
        if ONE_PROCESS.search(text) and MULTI_RANK.search(text):
            raise pytest.UsageError(f"{path.name}: its module says ONE_PROCESS_MPI but launches ranks "
                                    f"({MULTI_RANK.search(text).group(0)!r}); remove the declaration")
    strays = [i.nodeid for i in items if i.get_closest_marker("mpi") is not None and lane_of(i.nodeid) != LANE_MPI
              and not ONE_PROCESS.search(_module_text(Path(str(i.fspath))))]
    if strays:
        raise pytest.UsageError(f"{strays[0]} is marked mpi but its module is in the unit lane "
                                "(tests/conftest.py lane_of): write pytest.mark.mpi in its module")
    # the tests that run no MPI first (one core), while the compiled loops are warmed on the other
    # (:func:`pytest_configure`); then those that launch jobs, each module's tests still together
    items.sort(key=lambda item: item.get_closest_marker("mpi") is not None)


LANE_MPI, LANE_UNIT = "mpi-jobs", "unit-tests"


def lane_of(nodeid: str, root: Path = HERE.parent) -> str:
    """The lane of a test under two workers: the modules that run MPI (:data:`MPI_USE`, or a test marked
    ``mpi`` by hand) in one, the rest in the other, with those that run one MPI process at a time and say so
    (:data:`ONE_PROCESS`, and none of :data:`MULTI_RANK`)."""
    path = root / nodeid.split("::", 1)[0]
    text = _module_text(path) if path.is_file() else ""
    if not (MPI_USE.search(text) or "mark.mpi" in text):
        return LANE_UNIT
    return LANE_UNIT if ONE_PROCESS.search(text) and not MULTI_RANK.search(text) else LANE_MPI


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it (``-p no:xdist``) one process runs all
def pytest_xdist_make_scheduler(config, log):
    """Two workers (``-n 2``, setup.cfg) as two lanes, one worker each: every MPI job on one, so an MPI job
    never shares the cores with another (ranks that wait poll, and would take each other's turns), and the
    unit tests on the other, filling what the jobs leave idle (launches, waits on signals and steps,
    one-rank jobs).  (pytest-xdist's own ``loadgroup`` cannot do it under pytest 9, whose node ids it
    can no longer rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid, Path(str(config.rootpath)))

    return Lanes(config, log)


#: the mpiexec an unmarked test gets (:func:`_unmarked_tests_run_no_mpi`): it answers a launcher's
#: queries (``--version`` and the like) with the real one and refuses to start a job
_GUARD = """#!/bin/sh
case "$1" in --version|-V|-v|--help|-h|-info|--info) exec "{real}" "$@";; esac
echo "tests: $PYTEST_CURRENT_TEST launches MPI but is not marked mpi (tests/conftest.py MPI_USE)" >&2
exit 97
"""


@pytest.fixture(scope="session")
def _guard_mpiexec(tmp_path_factory) -> str:
    try:
        real = find_mpiexec()
    except RuntimeError:  # no MPI here: the unit tests still run
        real = "mpiexec"
    path = tmp_path_factory.mktemp("guard") / "mpiexec"
    path.write_text(_GUARD.format(real=real))
    path.chmod(0o755)
    return str(path)


MPI_MODULE = "mpi4py.MPI"


class _NoMPI(types.ModuleType):
    """``mpi4py.MPI`` for an unmarked test: any use of it fails the test, naming it."""

    def __getattr__(self, name):
        if name.startswith("__"):  # introspection (inspect, pickle) asks for dunders of every module
            raise AttributeError(name)
        raise RuntimeError(f"{os.environ.get('PYTEST_CURRENT_TEST', 'a test')} uses MPI in the test process but "
                           "is not marked mpi (tests/conftest.py MPI_USE)")


@pytest.fixture(autouse=True)
def _unmarked_tests_run_no_mpi(request, monkeypatch, _guard_mpiexec):
    """A test without the ``mpi`` marker runs no MPI: its launches meet a guard that refuses them, its
    subprocesses do not initialise MPI (``MPI4PY_RC_INITIALIZE=0``: their first MPI call fails), and in
    this process ``mpi4py.MPI``, if not imported yet, is a stand-in that fails on use. So every test that
    runs MPI is marked, and the Open MPI pass (``-m mpi``) misses none."""
    if request.node.get_closest_marker("mpi") is None:
        monkeypatch.setenv("MPISPARSE_MPIEXEC", _guard_mpiexec)
        monkeypatch.setenv("MPI4PY_RC_INITIALIZE", "0")
        if MPI_MODULE not in sys.modules:
            monkeypatch.setitem(sys.modules, MPI_MODULE, _NoMPI(MPI_MODULE))
    yield


# --------------------------------------------------------------------------- the suite's time budget
#: ``MPISPARSE_SUITE_BUDGET_S=S``: the run fails when the whole session took longer than S seconds
#: (.ci/run sets it for the README's test command, so that drift shows when it starts, not at CI's limit)
BUDGET_ENV = "MPISPARSE_SUITE_BUDGET_S"


def suite_budget_verdict(elapsed: float, budget: str | None) -> str | None:
    """None within the budget (or with none set); else the one line that fails the run."""
    if not budget:
        return None
    limit = float(budget)
    if elapsed <= limit:
        return None
    return (f"the suite took {elapsed:.0f} s, over its budget of {limit:.0f} s ({BUDGET_ENV}): "
            f"find the new slow tests in the --durations list above")


#: numba compiles a loop at its first use and caches it in the package's __pycache__: without this, every
#: rank of the first jobs that step a scheme compiles the same loops at once (each 10-20 s of CPU)
WARM_COMPILED = """
import numpy as np
from mpisparse.backend import compiled, compiled_compensate, numpy_segment_topk
for idt in (np.int32, np.int64):
    compiled.warm_up(compiled.KERNELS, idt)
    compiled_compensate.warm_up(numpy_segment_topk._segc_sizing(), idt)
"""


#: a file the warm-up writes when it is done: the MPI lane's first job waits for it (:func:`_compiled_loops_warm`)
WARM_DONE_ENV = "MPISPARSE_TEST_WARM_DONE"


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker (the controller and a plain run have none)


def pytest_configure(config):
    """The run's controller (pytest alone, or xdist's controller before it starts its workers, which inherit
    the environment) starts the warm-up of the compiled loops and names the file it writes when done."""
    if _is_worker(config):
        return
    config._mpisparse_t0 = time.monotonic()
    if importlib.util.find_spec("numba") is not None and os.environ.get("MPISPARSE_FUSED", "1") != "0":
        config._mpisparse_warm_dir = tempfile.mkdtemp(prefix="mpisparse-warm-")
        done = Path(config._mpisparse_warm_dir) / "done"
        os.environ[WARM_DONE_ENV] = str(done)
        config._mpisparse_warm = subprocess.Popen(
            [sys.executable, "-c", "try:\n" + textwrap.indent(WARM_COMPILED, "    ")
             + f"finally:\n    open({str(done)!r}, 'w').close()\n"], cwd=HERE.parent,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, OMP_NUM_THREADS="1", MPI4PY_RC_INITIALIZE="0"))


#: how long the first MPI test waits for the warm-up (a fresh clone compiles for about 30 s of one core)
WARM_WAIT_S = 180
_warm_waited = False


@pytest.fixture(autouse=True)
def _compiled_loops_warm(request):
    """An MPI test starts after the warm-up finished (or failed, or :data:`WARM_WAIT_S` passed): otherwise
    every rank of the first jobs would compile the same loops at once."""
    global _warm_waited
    path = os.environ.get(WARM_DONE_ENV)
    if not _warm_waited and path and request.node.get_closest_marker("mpi") is not None:
        _warm_waited = True
        deadline = time.monotonic() + WARM_WAIT_S
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    yield


def pytest_unconfigure(config):
    warm = getattr(config, "_mpisparse_warm", None)
    if warm is not None and warm.poll() is None:
        warm.kill()
        warm.wait()
    if getattr(config, "_mpisparse_warm_dir", None):
        shutil.rmtree(config._mpisparse_warm_dir, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    t0 = getattr(session.config, "_mpisparse_t0", None)
    if t0 is None:  # an xdist worker: the controller judges the whole run
        return
    verdict = suite_budget_verdict(time.monotonic() - t0, os.environ.get(BUDGET_ENV))
    if verdict is not None:
        session.config._mpisparse_budget_verdict = verdict
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    verdict = getattr(config, "_mpisparse_budget_verdict", None)
    if verdict is not None:
        terminalreporter.write_line(f"BUDGET EXCEEDED: {verdict}", red=True)
