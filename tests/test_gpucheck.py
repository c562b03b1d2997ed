"""bin/gpu-check: its plan, its verdicts on recorded results, and its one-line refusal without a GPU."""

import subprocess
import sys

from conftest import HERE
from mpisparse.gpucheck import Check, plan, summarise, to_markdown


def test_the_plan_runs_every_gpu_benchmark_and_short_trains(tmp_path):
    checks = plan(tmp_path, python="python")
    names = [c.name for c in checks]
    assert names == ["gpu-tests", "info", "select", "select-deft", "step", "train-cuda-dense", "train-cuda-topk",
                     "train-cuda-cltk", "train-cuda-deft", "train-cpu-deft"]
    assert checks[0].env == {"MPISPARSE_TEST_GPU": "1"}
    step = next(c for c in checks if c.name == "step")
    assert "--device" in step.argv and step.argv[step.argv.index("--device") + 1] == "cuda"
    assert all(c.json is None or c.json.startswith(str(tmp_path)) for c in checks)


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
        "step": [{"scheme": s, "step_seconds": 0.01} for s in ("dense", "topk", "cltk", "deft")],
        "train-cuda-deft": acc(0.9700), "train-cpu-deft": acc(0.9740),
        **{f"train-cuda-{s}": acc(0.96) for s in ("dense", "topk", "cltk")},
    }
    rows = {r["target"]: r for r in summarise(checks, results)}
    assert rows["select: threshold_select/one_read <= 2"]["met"] is True
    assert rows["select: torch_topk/topk_abs >= 5"]["met"] is False
    assert rows["deft: selection W=1 <= 1 ms"]["met"] is True and rows["deft: selection W=4 <= 0.4 ms"]["met"] is False
    assert rows["deft: layer norms <= 0.1 ms"]["met"] is False
    assert rows["deft on the GPU within 0.5 points of the CPU run (same seed)"]["met"] is True
    results["train-cpu-deft"] = acc(0.9800)
    rows = {r["target"]: r for r in summarise(checks, results)}
    assert rows["deft on the GPU within 0.5 points of the CPU run (same seed)"]["met"] is False
    missing = {r["target"]: r for r in summarise(checks, {})}
    assert missing["train --device cuda --scheme deft: runs"]["met"] is None
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
