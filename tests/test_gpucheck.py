"""bin/gpu-check: its plan, its verdicts on recorded results, and its one-line refusal without a GPU."""

import subprocess
import sys

from conftest import HERE
from mpisparse.bench.gpucheck import STEP_SCHEMES, Check, plan, run_check, summarise, to_markdown


def test_the_plan_runs_every_gpu_benchmark_and_short_trains(tmp_path):
    checks = plan(tmp_path, python="python")
    names = [c.name for c in checks]
    assert names[:14] == ["gpu-tests", "info", "select", "select-deft", "fixed-cost", "step-torch-peer",
                          "library-cuda", "step", "step-hier", "step-cpu-16", "step-cpu-16-gradient", "torchrun-cuda",
                          "impi-info", "impi-step"]
    lib = next(c for c in checks if c.name == "library-cuda")
    assert lib.argv[lib.argv.index("overlap") - 1] == "bench" and lib.argv[lib.argv.index("--device") + 1] == "cuda"
    assert names[14:-2] == [f"train-{d}-{s}" for s in STEP_SCHEMES for d in ("cuda", "cpu")]
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


def test_issue_table_says_measured_target_met_for_every_row():
    from mpisparse.bench.gpucheck import issue_table

    results = {
        "select": {"timings": {"topk_abs": {"best_ms": 0.095}, "topk_abs_radix2": {"best_ms": 0.12}},
                   "ratios": {"torch_topk/topk_abs": 7.2, "threshold_select/one_read": 2.3,
                              "torch_topk/topk_abs_radix2": 5.7}},
        "fixed-cost": {"n": 65536, "target_ms": 0.015, "replay_equals_fresh": True,
                       "ms": {"threshold_select": {"plain": 0.04, "graph": 0.012, "graph_reuse": 0.010},
                              "topk_abs_sample": {"plain": 0.11, "graph": 0.02, "graph_reuse": 0.018}}},
        "select-deft": [{"world_size": 1, "deft_max_seconds": 0.0009, "norms_ms": 0.05},
                        {"world_size": 4, "deft_max_seconds": 0.00025, "norms_ms": 0.05}],
        "step-torch-peer": [{"scheme": "topk", "step_seconds": 0.003}, {"scheme": "torch-topk", "step_seconds": 0.009}],
        "impi-step": [{"scheme": "dense", "staging_copies_per_step": {"d2h": 0, "h2d": 0}},
                      {"scheme": "topk", "staging_copies_per_step": {"d2h": 0, "h2d": 0}}],
    }
    rows = issue_table(results)
    assert [r["met"] for r in rows] == [True, False, False, True, True, True, False, True]
    assert rows[6]["measured"] == "0.120 ms = 5.70x torch.topk" and "radix2" in rows[6]["row"]
    assert rows[0]["measured"] == "0.095 ms = 7.20x torch.topk" and rows[0]["target"].startswith("<= 0.10 ms")
    assert "topk_abs_sample 0.0180 ms (plain 0.1100)" in rows[2]["measured"]
    assert all(r["met"] is None and r["measured"] == "-" for r in issue_table({}))


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
