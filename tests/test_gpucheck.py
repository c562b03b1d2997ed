"""bin/gpu-check: its plan, its verdicts on recorded results, and its one-line refusal without a GPU."""

import subprocess
import sys

from conftest import HERE
from mpisparse.bench.gpucheck import STEP_SCHEMES, Check, plan, run_check, summarise, to_markdown


def test_the_plan_runs_every_gpu_benchmark_and_short_trains(tmp_path):
    checks = plan(tmp_path, python="python")
    names = [c.name for c in checks]
    assert names[:18] == ["gpu-tests", "info", "select", "select-deft", "fixed-cost", "step-torch-peer",
                          "library-cuda", "step", "step-hier", "step-cpu-16", "step-cpu-16-gradient", "torchrun-cuda",
                          "impi-info", "impi-step", "cuda-mpi-info", "cuda-mpi-tests", "cuda-mpi-step",
                          "cuda-mpi-step-staged"]
    lib = next(c for c in checks if c.name == "library-cuda")
    assert lib.argv[lib.argv.index("overlap") - 1] == "bench" and lib.argv[lib.argv.index("--device") + 1] == "cuda"
    assert names[18:-2] == [f"train-{d}-{s}" for s in STEP_SCHEMES for d in ("cuda", "cpu")]
    assert names[-2:] == ["tta-cuda", "select-sweep"]
    tta = next(c for c in checks if c.name == "tta-cuda")
    assert tta.argv[tta.argv.index("--device") + 1] == "cuda" and "--quick" in tta.argv
    mem = next(c for c in checks if c.name == "step-cpu-16")
    assert mem.argv[mem.argv.index("-n") + 1] == "16" and "--device" not in mem.argv
    into = next(c for c in checks if c.name == "step-cpu-16-gradient")
    assert into.argv[into.argv.index("--output") + 1] == "gradient"
    assert sorted(into.argv[i + 1] for i, a in enumerate(into.argv) if a == "--scheme") == sorted(STEP_SCHEMES)
    assert checks[0].env == {"MPISPARSE_TEST_GPU": "1"}
    for name in ("step", "step-hier"):
        step = next(c for c in checks if c.name == name)
        assert "--device" in step.argv and step.argv[step.argv.index("--device") + 1] == "cuda"
    step = next(c for c in checks if c.name == "step")
    assert [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--scheme"] == list(STEP_SCHEMES)
    assert all(c.json is None or c.json.startswith(str(tmp_path)) for c in checks)
    peer = next(c for c in checks if c.name == "step-torch-peer")
    assert "--torch-peer" in peer.argv and peer.argv[peer.argv.index("--device") + 1] == "cuda"
    impi = [c for c in checks if c.name.startswith("impi-")]
    assert all(c.skipped.startswith("skipped: set MPISPARSE_IMPI_PYTHON") for c in impi)
    impi = [c for c in plan(tmp_path, python="python", impi_python="/v/bin/python") if c.name.startswith("impi-")]
    assert all(not c.skipped and c.argv[0] == "/v/bin/python" and c.env["I_MPI_OFFLOAD"] == "1" for c in impi)
    assert "--cuda-aware" in impi[1].argv


def test_floor_table_says_measured_target_met_for_every_row():
    from mpisparse.bench.gpucheck_floor import floor_table

    results = {  # recorded-style results: radix2 at 1.2 copies misses, threshold at 0.7 copies meets, ...
        "select": {"timings": {"copy": {"best_ms": 0.060}, "topk_abs_radix2": {"best_ms": 0.072},
                               "threshold_select": {"best_ms": 0.042}, "torch_topk": {"best_ms": 0.690}}},
        "fixed-cost": {"n": 65536, "replay_equals_fresh": True,
                       "ms": {"threshold_select": {"plain": 0.04, "graph": 0.012, "graph_reuse": 0.010},
                              "topk_abs_radix2": {"plain": 0.05, "graph": 0.016, "graph_reuse": 0.014}}},
        "select-deft": [{"world_size": 1, "deft_max_seconds": 0.00081, "norms_ms": 0.049},
                        {"world_size": 4, "deft_max_seconds": 0.00029, "norms_ms": 0.05}],
        "library-cuda": {"rows": [{"scheme": "dense", "library_ms": 2.3, "library_local_step_ms": 1.4,
                                   "library_flag_reads_per_step": 1.0},
                                  {"scheme": "topk", "library_ms": 2.0, "library_local_step_ms": 1.4}]},
        "cuda-mpi-info": {"cuda_aware": True, "cuda_aware_how": "library: yes"},
        "cuda-mpi-step": [{"scheme": "dense", "step_seconds": 0.004, "staging_copies_per_step": {"d2h": 0, "h2d": 0}},
                          {"scheme": "topk", "step_seconds": 0.003, "staging_copies_per_step": {"d2h": 0, "h2d": 0}}],
    }
    rows = floor_table(results)
    assert [r["met"] for r in rows] == ["yardstick", False, True, True, True, False, True, True, False, True, True]
    assert rows[1]["measured"] == "0.072 ms = 1.20 copies; torch.topk 0.690 ms = 9.6x"
    assert rows[1]["target"] == "<= 1 copy and >= 11x torch.topk"
    assert rows[2]["measured"] == "0.042 ms = 0.70 copies" and rows[2]["target"] == "<= 0.75 copy"
    assert "topk_abs_radix2 0.0140 ms" in rows[3]["measured"]
    assert [r["target"] for r in rows[4:7]] == ["<= 0.3 ms", "<= 0.8 ms", "<= 0.05 ms"]
    assert rows[7]["measured"] == "0.90 ms (local step 1.40 ms; flag reads a step 1)" and rows[8]["target"] == "<= 0.5 ms"
    assert rows[8]["measured"] == "0.60 ms (local step 1.40 ms)"
    # a replay that differs from a fresh call fails the row however fast
    results["fixed-cost"]["replay_equals_fresh"] = False
    assert floor_table(results)[3]["met"] is False
    # one staging copy fails the CUDA-aware row
    results["cuda-mpi-step"][1]["staging_copies_per_step"]["d2h"] = 1
    assert floor_table(results)[-1]["met"] is False
    assert all(r["met"] is None and r["measured"] == "-" for r in floor_table({}))


def test_floor_runs_the_table_checks_first_and_the_cuda_mpi_ones_under_its_env(tmp_path, monkeypatch):
    from mpisparse.bench import gpucheck

    monkeypatch.setattr(gpucheck, "_gpu_missing", lambda: None)
    monkeypatch.setattr(gpucheck, "machine", lambda: {"device": "test"})
    monkeypatch.delenv("MPISPARSE_CUDA_MPI", raising=False)
    ran = []
    monkeypatch.setattr(gpucheck, "run_check", lambda c, cwd: (ran.append(c.name), (0, 0.0, "ok"))[1])
    assert gpucheck.main([str(tmp_path / "a"), "--floor"]) == 0
    assert ran == [n for n in gpucheck.FLOOR_CHECKS if not n.startswith("cuda-mpi")]
    md = (tmp_path / "a" / "gpu-check.md").read_text()
    assert md.index("## The GPU floor (issue 47)") < md.index("## Targets")
    assert "| cuda-mpi-info | skipped: set MPISPARSE_CUDA_MPI" in md
    checks = {c.name: c for c in gpucheck.plan(tmp_path, cuda_mpi="/opt/x")}
    aware = checks["cuda-mpi-step"]
    assert aware.argv[:3] == gpucheck.UNDER_CUDA_MPI[:3] and "--cuda-aware" in aware.argv
    assert "--no-cuda-aware" in checks["cuda-mpi-step-staged"].argv
    assert aware.env["MPISPARSE_CUDA_MPI"] == "/opt/x" and not aware.skipped
    assert checks["cuda-mpi-tests"].env["MPISPARSE_CUDA_AWARE"] == "1"


DEFT_ROW = "train --scheme deft: the GPU run within 0.5 points of the CPU run (same seed)"


def test_verdicts_from_recorded_results(tmp_path):
    checks = plan(tmp_path, python="python")
    for c in checks:
        c.returncode = 0
    acc = lambda a: {"metrics": {"final": {"test_accuracy": a}}}  # noqa: E731
    results = {
        "select": {"targets": {"threshold_select/one_read <= 2": True, "torch_topk/topk_abs >= 5": False},
                   "ratios": {"threshold_select/one_read": 1.8, "torch_topk/topk_abs": 2.9},
                   "auto": {"picked": "radix", "fastest": "radix", "auto_is_fastest": True},
                   "checks": {"topk_exact_auto": True}},
        "select-deft": [{"world_size": 1, "deft_max_seconds": 0.0009, "target_select_ms": 1.0, "peer_topk_ms": 9.0,
                         "norms_ms": 0.2, "target_norms_ms": 0.1, "peer_norms_ms": 0.7},
                        {"world_size": 4, "deft_max_seconds": 0.0005, "target_select_ms": 0.4, "peer_topk_ms": 2.4,
                         "norms_ms": 0.2, "target_norms_ms": 0.1, "peer_norms_ms": 0.7}],
        "step": [{"scheme": s, "step_seconds": 0.01} for s in STEP_SCHEMES],
        "step-hier": [{"scheme": "dense", "step_seconds": 0.01}],
        "step-cpu-16": [{"scheme": "topk", "peak_rss_bytes_per_rank": 440, "gradient_buffer_bytes": 100},
                        {"scheme": "dgc", "peak_rss_bytes_per_rank": 530, "gradient_buffer_bytes": 100}],
        "step-cpu-16-gradient": [{"scheme": "dgc", "peak_rss_bytes_per_rank": 432, "gradient_buffer_bytes": 100}],
        "torchrun-cuda": acc(0.95),
        "train-cuda-deft": acc(0.9700), "train-cpu-deft": acc(0.9740),
        **{f"train-{d}-{s}": acc(0.96) for s in ("dense", "topk", "cltk") for d in ("cuda", "cpu")},
    }
    rows = {r["target"]: r for r in summarise(checks, results)}
    assert rows["select: threshold_select/one_read <= 2"]["met"] is True
    assert rows["select: torch_topk/topk_abs >= 5"]["met"] is False
    assert rows["deft: selection W=1 <= 1 ms"]["met"] is True and rows["deft: selection W=4 <= 0.4 ms"]["met"] is False
    assert rows["deft: layer norms <= 0.1 ms"]["met"] is False
    assert rows[DEFT_ROW]["met"] is True
    assert rows["train --scheme topk: the GPU run within 0.5 points of the CPU run (same seed)"]["met"] is True
    assert rows["step: every scheme ran on the device"]["met"] is True
    assert rows["step-cpu-16: topk peak RSS per rank <= 4.5x the buffer"]["met"] is True
    assert rows["step-cpu-16: dgc peak RSS per rank <= 4.5x the buffer"]["measured"] == "5.30x"
    assert rows["step-cpu-16: dgc peak RSS per rank <= 4.5x the buffer"]["met"] is False
    assert rows["step-cpu-16-gradient: dgc peak RSS per rank <= 4.5x the buffer"]["met"] is True
    assert rows["torchrun -m mpisparse train --device cuda: runs"]["met"] is True
    assert rows["step-hier: every scheme ran on the device"]["met"] is False  # cltk and topk missing
    results["train-cpu-deft"] = acc(0.9800)
    rows = {r["target"]: r for r in summarise(checks, results)}
    assert rows[DEFT_ROW]["met"] is False
    missing = {r["target"]: r for r in summarise(checks, {})}
    assert missing[DEFT_ROW]["met"] is None
    md = to_markdown({"command": "bin/gpu-check out", "machine": {"device": "X"}, "targets": summarise(checks, results),
                      "checks": [vars(Check("info", ["python", "-m", "mpisparse", "info"], returncode=0))]})
    assert "| select: torch_topk/topk_abs >= 5 | 2.90 | **no** |" in md and "| info | 0 |" in md


def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(HERE.parent / "bin" / "gpu-check"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: ") and "CUDA GPU" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_check_past_its_timeout_is_killed_with_its_children(tmp_path):
    """The whole process group goes at the timeout (a child holding the pipe must not hang the check)."""
    c = Check("sleepy", ["bash", "-c", "echo started; sleep 60 & sleep 60"], timeout=2)
    code, seconds, output = run_check(c, tmp_path)
    assert code == 124 and seconds < 30
    assert output.startswith("started") and "timed out after 2 s" in output
    code, _, output = run_check(Check("ok", ["bash", "-c", "echo out; echo err >&2; exit 3"]), tmp_path)
    assert code == 3 and "out" in output and "err" in output


def test_only_names_known_checks_and_deadline_skips(tmp_path, monkeypatch):
    from mpisparse.bench import gpucheck

    monkeypatch.setattr(gpucheck, "_gpu_missing", lambda: None)
    monkeypatch.setattr(gpucheck, "machine", lambda: {"device": "test"})
    assert gpucheck.main([str(tmp_path / "a"), "--only", "nope"]) == 2
    ran = []
    monkeypatch.setattr(gpucheck, "run_check", lambda c, cwd: (ran.append(c.name), (0, 0.0, "ok"))[1])
    assert gpucheck.main([str(tmp_path / "b"), "--only", "info,select"]) == 0
    assert ran == ["info", "select"] and (tmp_path / "b" / "info.log").read_text() == "ok"
    ran.clear()
    gpucheck.main([str(tmp_path / "c"), "--deadline", "-1"])
    assert ran == []
    md = (tmp_path / "c" / "gpu-check.md").read_text()
    assert "| gpu-tests | skipped: past --deadline -1 s |" in md


def test_the_checks_run_in_the_checkout_root():
    from mpisparse.bench.gpucheck import repo_root

    root = repo_root()
    assert (root / "tests").is_dir() and (root / "mpisparse" / "__init__.py").is_file()
    assert not (root / "torch").exists()  # from inside the package `import torch` would find mpisparse/torch
