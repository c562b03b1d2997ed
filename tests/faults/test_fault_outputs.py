"""Results are never lost to an unwritable output path.

Before any MPI work: an output file (``--json``, ``--csv``, ``--plot``) or
directory (``--checkpoint``, ``--out``) that cannot be written is a usage
error (exit 2) whose one ``Error:`` line names the option, the path and why.
The paths are tried, not judged by permission bits: the tests run as root,
who writes through ``chmod``, so the unwritable paths here lie under a
regular file, in a directory that does not exist, in ``/proc``, or (as an
unprivileged user) in a read-only directory.

At the end of a run: a path that became unwritable during the run gets a
one-line warning on stderr and the results are printed to stdout as JSON.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpisparse.results import Fallback, RunResult, path_problem, write_results
from mpisparse.results import files as result_files

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def mpisparse(*args: str, cwd: Path = ROOT, user: int | None = None, timeout: int = 60):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    kw = {"user": user} if user is not None else {}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "mpisparse", *args], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=timeout, **kw)
    return p, time.monotonic() - t0


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture
def file_txt(tmp_path: Path) -> Path:
    f = tmp_path / "file.txt"
    f.write_text("a regular file\n")
    return f


BENCH = ["bench", "step", "-n", "2", "--model", "ncf", "--scheme", "topk", "--iters", "1", "--warmup", "0"]
TRAIN = ["train", "-n", "2", "--epochs", "1"]


@pytest.mark.parametrize("command, option, where, why", [
    (BENCH, "--json", "missing", "directory {d} does not exist"),
    (BENCH, "--csv", "under_file", "{f} is not a directory"),
    (BENCH, "--plot", "proc", "cannot create a file in /proc"),
    (TRAIN, "--json", "under_file", "{f} is not a directory"),
    (TRAIN, "--csv", "missing", "directory {d} does not exist"),
    (TRAIN, "--checkpoint", "under_file", "{f} is not a directory"),
])
def test_unwritable_output_is_a_usage_error_before_mpi(tmp_path, file_txt, command, option, where, why):
    missing_dir = tmp_path / "nonexistent-dir"
    path = {"missing": missing_dir / "x.out", "under_file": file_txt / "x.out", "proc": Path("/proc/x.png")}[where]
    p, seconds = mpisparse(*command, option, str(path))
    assert p.returncode == 2, p.stdout + p.stderr
    line = error_line(p)
    assert f"'{option}'" in line and str(path) in line, line
    assert why.format(d=missing_dir, f=file_txt) in line, line
    assert p.stdout == "" and "Traceback" not in p.stderr
    assert "mpiexec" not in p.stderr and seconds < 30  # no MPI job was started
    assert not missing_dir.exists() and file_txt.read_text() == "a regular file\n"  # nothing created or touched


def test_driver_out_directories_are_checked_first(tmp_path, file_txt):
    p, _ = mpisparse("bench", "scaling", "--worlds", "1", "--model", "ncf", "--scheme", "topk", "--iters", "1",
                     "--out", str(file_txt / "runs"))
    assert p.returncode == 2 and f"{file_txt} is not a directory" in error_line(p)
    p, _ = mpisparse("reproduce", "deft-speedup", "--quick", "--out", str(file_txt))
    assert p.returncode == 2 and str(file_txt) in error_line(p) and "is a file" in error_line(p)
    p, _ = mpisparse("reproduce", "deft-speedup", "--quick", "--json", str(tmp_path / "no" / "r.json"))
    assert p.returncode == 2 and "does not exist" in error_line(p)


def _can_run_as_nobody() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    try:
        p = subprocess.run([sys.executable, "-c", "import mpisparse.cli"], capture_output=True, cwd="/",
                           env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}, user=NOBODY,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0


def test_read_only_checkpoint_directory_is_refused_at_once(tmp_path):
    """What a user without root meets: a read-only --checkpoint directory (chmod 555), refused before MPI."""
    if os.geteuid() != 0:
        user = None
    elif _can_run_as_nobody():
        user = NOBODY
    else:
        pytest.skip("running as root, and an unprivileged user cannot run Python from this checkout")
    work = tmp_path / "work"
    ck = work / "ck"
    ck.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(work, 0o777)
    os.chmod(ck, 0o555)
    try:
        p, seconds = mpisparse(*TRAIN, "--checkpoint", str(ck), cwd=work, user=user)
        assert p.returncode == 2, p.stdout + p.stderr
        line = error_line(p)
        assert "'--checkpoint'" in line and str(ck) in line and "permission denied" in line, line
        p, _ = mpisparse(*TRAIN, "--json", str(ck / "r.json"), cwd=work, user=user)
        assert p.returncode == 2 and "permission denied" in error_line(p)
    finally:
        os.chmod(ck, 0o755)
    assert list(ck.iterdir()) == []


def test_path_problem_leaves_nothing_behind(tmp_path, file_txt):
    assert path_problem(tmp_path / "x.json") is None and list(tmp_path.iterdir()) == [file_txt]
    assert path_problem(tmp_path / "new" / "deeper", directory=True) is None and not (tmp_path / "new").exists()
    assert path_problem(tmp_path) == "it is a directory"
    assert path_problem(file_txt, directory=True) == "it exists and is not a directory"
    assert path_problem(file_txt) is None and file_txt.read_text() == "a regular file\n"


# --------------------------------------------------------------------------- writing fails at the end
def _result(scheme: str) -> RunResult:
    return RunResult(scheme=scheme, runtime="collective", world_size=2, density_target=0.01, density_actual=0.01,
                     bytes_sent_per_rank=100.0, phases={"select": 0.001}, phases_mean_over_ranks={"select": 0.001},
                     step_seconds=0.002, step_seconds_mean_over_ranks=0.002, n=1000, config={"model": "ncf"})


def test_results_go_to_stdout_when_the_json_path_becomes_unwritable(tmp_path, monkeypatch, capsys):
    """The path was writable when checked; by the end of the run it is not (a full disk, a removed mount)."""
    results = [_result("dense"), _result("topk")]
    target = tmp_path / "r.json"

    def failing_write(path, obj):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("mpisparse.results.write_json", failing_write)
    write_results(results, command="bench step", json_path=target, csv_path=tmp_path / "r.csv")
    out, err = capsys.readouterr()
    assert json.loads(out) == [r.to_dict() for r in results]  # every result, as the JSON file would hold it
    assert err.count("\n") == 1 and err.startswith(f"mpisparse: warning: --json {target}: cannot write it "
                                                   "(permission denied)"), err
    assert (tmp_path / "r.csv").is_file() and not target.exists()  # the other outputs are still written


def test_several_failing_outputs_print_the_results_once(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    fb = Fallback({"scheme": "topk"}, out=out, err=err)
    gone = tmp_path / "gone"
    assert fb.attempt("--json", gone / "r.json", lambda: result_files.write_json(gone / "r.json", {})) is False
    assert fb.attempt("--csv", gone / "r.csv", lambda: result_files.write_csv(gone / "r.csv", [{}])) is False
    assert fb.attempt("--plot", None, lambda: 1 / 0) is True  # not asked for: nothing runs
    assert json.loads(out.getvalue()) == {"scheme": "topk"}
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and "--json" in lines[0] and "--csv" in lines[1] and fb.failed == ["--json", "--csv"]
    assert "no such file or directory" in lines[0]


def test_read_only_directory_as_root_sees_it(tmp_path, monkeypatch):
    """Root writes through chmod 555, so the read-only directory is emulated where files are created:
    the check is the same code path a user without root takes (creating a file fails with EACCES)."""
    from click.testing import CliRunner

    from mpisparse.cli import cli

    ck = tmp_path / "ck"
    ck.mkdir()
    real = result_files.tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):
        if Path(dir) == ck:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(result_files.tempfile, "mkstemp", mkstemp)
    res = CliRunner().invoke(cli, ["train", "-n", "2", "--epochs", "1", "--checkpoint", str(ck)])
    assert res.exit_code == 2, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert line == (f"Error: Invalid value for '--checkpoint': {ck} cannot be written: cannot create a file in "
                    f"{ck}: permission denied")
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()
