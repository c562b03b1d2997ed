"""The bench suites' outputs: JSON contract, CSV header, PNG signature; the driver's helpers.

``bench step``, ``bench exchange`` and ``bench select`` run as small bounded
jobs on the NCF shapes (0.4 M elements); ``bench scaling`` drives its own
``mpiexec`` jobs.  The helpers (tables, CSV, the sub-job command lines, the
scaling plan) are checked in-process.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import HERE, mpi_run
from mpisparse.bench.exchange import EXCHANGE_PHASES, exchange_keys
from mpisparse.results import PNG_SIGNATURE, Column, columns_of, format_rows, result_row, write_csv
from mpisparse.bench.runs import SubRun, child_env, display_command, launch_argv, scheme_option_args
from mpisparse.bench.scaling import attach_speedups, plan_scaling
from mpisparse.cli import cli

CONTRACT = ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank", "phases",
            "step_seconds", "config")
# CSV columns carry their units: times in ms, sizes in bytes (never seconds)
CSV_HEAD = ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank", "step_ms")


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


needs_mpl = pytest.mark.skipif(not has_matplotlib(), reason="matplotlib is not installed")


def check_png(path) -> None:
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) > 1000


def csv_rows(path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


def check_contract(obj: dict) -> None:
    missing = [k for k in CONTRACT if k not in obj]
    assert not missing, missing
    assert isinstance(obj["phases"], dict) and obj["phases"]
    assert 0 < obj["density_actual"] <= 1


# --------------------------------------------------------------------------- helpers, in-process
def test_format_rows_aligns_and_marks_missing_values():
    text = format_rows([{"a": "x", "b": 1.5}, {"a": "longer", "b": None}],
                       [Column("a", "name", align="<"), Column("b", "value", "{:.2f}")], title="t")
    lines = text.splitlines()
    assert lines[0] == "t"
    assert lines[1].startswith("name") and lines[1].endswith("value")
    assert lines[3] == "x        1.50"
    assert lines[4].endswith("-")


def test_result_row_and_csv_put_contract_first_and_phases_in_vocabulary_order(tmp_path):
    res = {"scheme": "topk", "world_size": 2, "density_target": 0.01, "density_actual": 0.017,
           "bytes_sent_per_rank": 10.0, "step_seconds": 0.5, "n": 100, "k": 1,
           "phases": {"update": 0.1, "select": 0.2}, "config": {"model": "ncf"}}
    row = result_row(res, extra=1)
    assert list(row)[:7] == ["model", *CSV_HEAD]
    assert row["phase_select_ms"] == pytest.approx(200.0) and row["extra"] == 1
    assert row["step_ms"] == pytest.approx(500.0) and not any(k.endswith("seconds") for k in row)
    other = dict(res, phases={"exchange_values": 0.3})
    cols = columns_of([row, result_row(other)])
    assert cols[-3:] == ["phase_select_ms", "phase_exchange_values_ms", "phase_update_ms"]
    write_csv(tmp_path / "x.csv", [row, result_row(other), {"scheme": "y", "nested": [1]}])
    head, rows = csv_rows(tmp_path / "x.csv")
    assert head[:7] == ["model", *CSV_HEAD] and "nested" not in head and len(rows) == 3


def test_exchange_keys_sum_the_exchange_phases():
    res = {"phases": {"select": 1.0, "exchange_indices": 0.25, "exchange_values": 0.5, "push": 0.125},
           "phases_mean_over_ranks": {"exchange_values": 0.5}, "bytes_sent_per_rank": 80.0, "k": 10}
    keys = exchange_keys(res)
    assert keys["exchange_seconds"] == pytest.approx(0.875)
    assert keys["exchange_seconds_mean_over_ranks"] == pytest.approx(0.5)
    assert set(keys["exchange_phases"]) == {"exchange_indices", "exchange_values", "push"} <= set(EXCHANGE_PHASES)
    assert keys["bytes_per_selected"] == pytest.approx(8.0)


def test_subrun_command_lines_and_environment(tmp_path):
    out = tmp_path / "a b.json"
    run = SubRun(["bench", "step"], ["--model", "ncf", "--json", str(out)], n=4)
    assert display_command(run) == f"OMP_NUM_THREADS=1 mpisparse bench step -n 4 --model ncf --json '{out}'"
    argv = launch_argv(run, timeout=30)
    assert argv[:4] == [sys.executable, "-m", "mpisparse", "bench"]
    assert argv[5:9] == ["-n", "4", "--timeout", "30"]
    emu = SubRun(["train"], ["--epochs", "1"], n=3, emucluster_rate="100mbit")
    assert display_command(emu, 60) == ("OMP_NUM_THREADS=1 bin/emucluster run 3 --rate 100mbit --timeout 60 -- "
                                        "mpisparse train --epochs 1")
    env = child_env(run, {"PMI_RANK": "0", "PMI_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "HOME": "/h", "PATH": ""})
    assert "PMI_RANK" not in env and "PMI_SIZE" not in env and "OMPI_COMM_WORLD_RANK" not in env
    assert env["HOME"] == "/h" and env["OMP_NUM_THREADS"] == "1" and env["PYTHON"] == sys.executable


def test_scheme_option_args():
    assert scheme_option_args({"a": {"beta": 0.1, "layerwise": True, "chunks": 4},
                               "b": {"beta": 0.1, "no_such": None, "flag": False}}) == [
        "--beta", "0.1", "--layerwise", "--chunks", "4"]


def test_scaling_plan_adds_baselines_and_drops_schemes_too_big_for_w(tmp_path):
    pts = plan_scaling(models=["ncf"], schemes=["topk", "slimdp"], worlds=[1, 3], densities=[0.01, 0.1], iters=2,
                       warmup=0, servers=1, out_dir=tmp_path)
    assert [(p.world, p.density) for p in pts] == [(1, 0.01), (1, 0.1), (3, 0.01), (3, 0.1)]
    assert pts[0].schemes == ["dense", "topk"]  # a parameter server needs 2 ranks
    assert pts[2].schemes == ["dense", "plumpdp", "topk", "slimdp"]
    assert pts[2].run.options.count("--servers") == 1 and pts[2].run.n == 3
    assert str(pts[3].run.json_path).endswith("ncf-W3-d0.1.json")
    with pytest.raises(ValueError, match="pipeline stages"):
        plan_scaling(models=["ncf"], schemes=["dct-mp"], worlds=[2], densities=[0.1], iters=1, warmup=0,
                     out_dir=tmp_path)


def test_attach_speedups_compares_with_the_family_baseline():
    rs = attach_speedups([{"scheme": "dense", "step_seconds": 2.0}, {"scheme": "topk", "step_seconds": 1.0},
                          {"scheme": "slimdp", "step_seconds": 1.0}])
    assert rs[0]["speedup_over_baseline"] == 1.0 and rs[1]["speedup_over_baseline"] == 2.0
    assert rs[2]["baseline"] is None and rs[2]["speedup_over_baseline"] is None


@pytest.mark.parametrize("args, message", [
    (["bench", "exchange", "--densities", "0,0.1"], "every density must be in the allowed range (0, 1]"),
    (["bench", "exchange", "--densities", "x"], "is not a comma-separated list of numbers"),
    (["bench", "exchange", "--scheme", "dct-mp"], "sparsifies activations between pipeline stages"),
    (["bench", "scaling", "--worlds", "0,2"], "every world size must be >= 1"),
    (["bench", "scaling", "--densities", "2"], "every density must be in the allowed range (0, 1]"),
    (["bench", "select", "--sizes", "0"], "every size must be >= 1"),
])
def test_bad_suite_options_fail_in_one_line(args, message):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


# --------------------------------------------------------------------------- the suites, as jobs
@pytest.mark.mpi
@needs_mpl
def test_bench_step_writes_json_csv_and_png(tmp_path):
    j, c, p = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "s.png"
    mpi_run(2, ["bench", "step", "--model", "ncf", "--scheme", "dense", "--scheme", "topk", "--iters", "2",
                "--warmup", "0", "--json", str(j), "--csv", str(c), "--plot", str(p)], module=True)
    objs = json.loads(j.read_text())
    assert [o["scheme"] for o in objs] == ["dense", "topk"]
    for o in objs:
        check_contract(o)
    head, rows = csv_rows(c)
    assert head[:7] == ["model", *CSV_HEAD] and "phase_select_ms" in head
    assert [r["scheme"] for r in rows] == ["dense", "topk"]
    assert float(rows[1]["bytes_sent_per_rank"]) == pytest.approx(objs[1]["bytes_sent_per_rank"])
    check_png(p)


@pytest.mark.mpi
@needs_mpl
def test_bench_exchange_times_each_scheme_over_densities(tmp_path):
    j, c, p = tmp_path / "e.json", tmp_path / "e.csv", tmp_path / "e.png"
    out = mpi_run(2, ["bench", "exchange", "--model", "ncf", "--scheme", "dense", "--scheme", "cltk",
                      "--densities", "0.01,0.1", "--iters", "2", "--warmup", "0", "--json", str(j), "--csv", str(c),
                      "--plot", str(p)], module=True).stdout
    assert "exchange ms" in out and "bytes/k" in out
    objs = json.loads(j.read_text())
    assert [(o["scheme"], o["density_target"]) for o in objs] == [("dense", 0.01), ("dense", 0.1),
                                                                  ("cltk", 0.01), ("cltk", 0.1)]
    for o in objs:
        check_contract(o)
        assert o["world_size"] == 2 and o["config"]["bench"] == "exchange"
        assert o["exchange_seconds"] == pytest.approx(sum(o["phases"].get(ph, 0.0) for ph in EXCHANGE_PHASES))
    n = objs[0]["n"]
    assert objs[0]["bytes_sent_per_rank"] == pytest.approx(4 * n)  # ring Allreduce at W=2: 2 (W-1)/W * 4n
    cl = objs[3]  # CLT-k: k indices broadcast by the leader, k values Allreduced
    assert cl["density_actual"] == pytest.approx(cl["k"] / n)
    head, rows = csv_rows(c)
    assert head[:7] == ["model", *CSV_HEAD] and "exchange_ms" in head and len(rows) == 4
    check_png(p)


@pytest.mark.mpi
@needs_mpl
def test_bench_scaling_runs_one_job_per_w_and_compares_with_dense(tmp_path):
    j, c, p = tmp_path / "sc.json", tmp_path / "sc.csv", tmp_path / "sc.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(HERE.parent), env.get("PYTHONPATH")) if x)
    proc = subprocess.run([sys.executable, "-m", "mpisparse", "bench", "scaling", "--worlds", "1,2", "--densities",
                           "0.01", "--model", "ncf", "--scheme", "topk", "--iters", "2", "--warmup", "0",
                           "--timeout", "120", "--json", str(j), "--csv", str(c), "--plot", str(p)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("$ OMP_NUM_THREADS=1 mpisparse bench step -n ") == 2
    # each job's JSON is kept in a named directory of the working directory: the printed paths exist
    [runs] = list((tmp_path / "mpisparse-results").glob("scaling-*"))
    assert f"each job's JSON is in {os.path.join('mpisparse-results', runs.name)}" in proc.stdout
    named = re.findall(r"--json (\S+)", proc.stdout)
    assert len(named) == 2 and all((tmp_path / x).is_file() for x in named), named
    objs = json.loads(j.read_text())
    assert sorted((o["scheme"], o["world_size"]) for o in objs) == [("dense", 1), ("dense", 2), ("topk", 1),
                                                                     ("topk", 2)]
    for o in objs:
        check_contract(o)
        assert o["baseline"] == "dense" and o["speedup_over_baseline"] > 0
    assert all(o["speedup_over_baseline"] == 1.0 for o in objs if o["scheme"] == "dense")
    head, rows = csv_rows(c)
    assert head[:7] == ["model", *CSV_HEAD] and "speedup_over_baseline" in head and len(rows) == 4
    check_png(p)


@needs_mpl
def test_bench_select_sweep_and_single_point(tmp_path):
    pytest.importorskip("torch")
    j, c, p = tmp_path / "k.json", tmp_path / "k.csv", tmp_path / "k.png"
    res = CliRunner().invoke(cli, ["bench", "select", "--sizes", "2000,20000", "--densities", "0.01,0.1",
                                   "--repeats", "1", "--json", str(j), "--csv", str(c), "--plot", str(p)])
    assert res.exit_code == 0, res.output
    objs = json.loads(j.read_text())
    assert [(o["params"]["n"], o["params"]["density"]) for o in objs] == [(2000, 0.01), (2000, 0.1), (20000, 0.01),
                                                                          (20000, 0.1)]
    assert all(o["checks"]["topk_exact"] for o in objs)
    head, rows = csv_rows(c)
    assert head[:4] == ["backend", "n", "density", "k"] and "topk_abs_best_ms" in head and len(rows) == 4
    check_png(p)
    # one size and one density: the single-point output and JSON object, as before
    one = tmp_path / "one.json"
    res = CliRunner().invoke(cli, ["bench", "select", "--sizes", "5000", "--densities", "0.01", "--repeats", "1",
                                   "--json", str(one)])
    assert res.exit_code == 0, res.output
    assert "topk exact: True" in res.output
    assert isinstance(json.loads(one.read_text()), dict)


@needs_mpl
def test_bench_select_deft_mode_csv_and_png(tmp_path):
    c, p = tmp_path / "d.csv", tmp_path / "d.png"
    res = CliRunner().invoke(cli, ["bench", "select", "--mode", "deft", "--model", "ncf", "--worlds", "1,2",
                                   "--repeats", "1", "--csv", str(c), "--plot", str(p)])
    assert res.exit_code == 0, res.output
    head, rows = csv_rows(c)
    assert "speedup_measured" in head and "deft_max_ms" in head and len(rows) == 2
    check_png(p)


# --------------------------------------------------------------------------- the diagnostics the targets read
@pytest.mark.mpi
def test_train_diagnostics_record_cltk_similarity_and_dct_threshold(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    j = tmp_path / "t.json"
    mpi_run(2, ["train", "--scheme", "cltk", "--scheme", "dct", "--lifespan", "1", "--density", "0.05",
                "--epochs", "1", "--diagnostics", "--json", str(j)], module=True)
    cl, dc = json.loads(j.read_text())
    steps = cl["diagnostics"]["per_step"]
    assert len(steps) == len(cl["diagnostics"]["density_per_step"]) > 10
    assert all(0.0 <= s["memory_cosine_distance"] <= 2.0 and 0.0 <= s["hamming_to_true_topk"] <= 1.0 for s in steps)
    assert [s["iteration"] for s in steps] == list(range(1, len(steps) + 1))
    taus = [s["tau_largest_layer"] for s in dc["diagnostics"]["per_step"]]
    assert all(t > 0 for t in taus) and all(s["tau_recomputed"] == 1.0 for s in dc["diagnostics"]["per_step"])
    assert "diagnostics" in dc["config"] and dc["config"]["diagnostics"] is True
