"""``mpisparse reproduce``: the registry, the report, each target's claims from known numbers, and the runs.

The claim logic of every target is a pure function of the runs' JSON, checked
here on hand-made results.  One target (``deft-speedup``, one process) runs
end to end in the default suite; every target runs in ``--quick`` form behind
``-m slow`` (CI sets ``MPISPARSE_QUICK=1``, which makes ``--quick`` smaller
still), printing its claim-vs-measured table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import HERE
from mpisparse.cli import cli
from mpisparse.reproduce import TARGETS
from mpisparse.reproduce import dct_threshold, deft_breakdown, deft_buildup, deft_speedup, dgs_speedup
from mpisparse.reproduce import scalecom_similarity, slimdp_traffic
from mpisparse.reproduce.base import Claim, Context, Skip, Target, claims_markdown, format_claims

NAMES = ["deft-buildup", "deft-breakdown", "deft-speedup", "scalecom-similarity", "dct-threshold",
         "slimdp-traffic", "dgs-speedup"]


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env)


# --------------------------------------------------------------------------- registry, command, report
def test_registry_and_list():
    assert list(TARGETS) == NAMES
    res = invoke("reproduce", "--list")
    assert res.exit_code == 0
    for name in NAMES:
        assert name in res.output
    for paper in ("DEFT (Yoon & Oh", "ScaleCom (Chen et al.", "DCT (Gupta et al.)", "Slim-DP (Sun et al.", "DGS (Yan"):
        assert paper in res.output


@pytest.mark.parametrize("args, message", [
    ([], "name a target (see --list), or `all`"),
    (["nope"], "no reproduce target 'nope'; targets: deft-buildup"),
    (["deft-speedup", "--emucluster", "fast"], "give auto, off, or a link rate"),
    (["deft-speedup", "--worlds", "0"], "every world size must be >= 1"),
])
def test_bad_reproduce_arguments(args, message):
    res = invoke("reproduce", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_context_sizes_and_worlds(tmp_path):
    ctx = Context(size="quick", out_dir=tmp_path)
    assert ctx.pick(1, 2, 3) == 2 and Context(size="tiny", out_dir=tmp_path).pick(1, 2) == 2
    assert ctx.worlds([1, 2, 4]) == [1, 2, 4] and ctx.world(2) == 2
    assert Context(size="full", out_dir=tmp_path, max_world=16).worlds([1, 2, 4, 8, 16, 32]) == [1, 2, 4, 8, 16]
    assert Context(size="full", out_dir=tmp_path, max_world=6).worlds([1, 2, 4, 8]) == [1, 2, 4, 6]
    assert Context(size="full", out_dir=tmp_path, worlds=[3, 5]).world(2) == 5
    assert Context(size="quick", out_dir=tmp_path, emucluster="off").network("1gbit", auto=True)[0] is None
    with pytest.raises(ValueError, match="allowed: full, quick, tiny"):
        Context(size="huge", out_dir=tmp_path)


class _NeedsMissing(Target):
    name = "needs-missing"
    title = "a target whose schemes are not there"
    seed = "test"
    requires_schemes = ("topk", "no-such-scheme")

    def run(self, ctx):  # pragma: no cover - never reached
        raise AssertionError("ran without its scheme")


def test_a_target_whose_scheme_is_missing_skips_and_names_it(monkeypatch, tmp_path):
    with pytest.raises(Skip, match="scheme 'no-such-scheme' is not registered"):
        _NeedsMissing().check()
    monkeypatch.setitem(TARGETS, "needs-missing", _NeedsMissing())
    j = tmp_path / "r.json"
    res = invoke("reproduce", "needs-missing", "--json", str(j), "--out", str(tmp_path / "runs"))
    assert res.exit_code == 0, res.output
    assert "SKIPPED: scheme 'no-such-scheme' is not registered" in res.output
    assert json.loads(j.read_text())["skipped"].startswith("scheme 'no-such-scheme'")


def test_claim_table_wraps_cells_and_renders_markdown():
    claims = [Claim("Fig. 1", "A long claim " * 8, "paper value", "measured value", True, note="a note"),
              Claim("Table 1", "short | piped", "x", "y", None)]
    text = format_claims(claims)
    assert text.splitlines()[0].split() == ["source", "paper's", "claim", "paper", "measured", "holds"]
    assert "note: a note" in text and "n/a" in text and max(len(ln) for ln in text.splitlines()) < 140
    md = claims_markdown(claims)
    assert md.splitlines()[2].startswith("| Fig. 1 | A long claim") and md.splitlines()[2].endswith("| yes |")
    assert "short \\| piped" in md


# --------------------------------------------------------------------------- each target's claims
def _res(scheme, w, density, target=0.01, **kw):
    return {"scheme": scheme, "world_size": w, "density_actual": density, "density_target": target,
            "bytes_sent_per_rank": 1.0, **kw}


def test_deft_buildup_claims():
    bench = deft_buildup.density_table({1: [_res("topk", 1, 0.01), _res("deft", 1, 0.01), _res("cltk", 1, 0.01)],
                                        2: [_res("topk", 2, 0.017), _res("deft", 2, 0.0101), _res("cltk", 2, 0.01)],
                                        4: [_res("topk", 4, 0.029), _res("deft", 4, 0.0102), _res("cltk", 4, 0.01)]})
    claims = deft_buildup.evaluate(bench, [])
    assert [c.holds for c in claims] == [True, None, True]
    assert "0.0170 (W=2)" in claims[0].measured and "2.90x at W=4" in claims[1].measured
    flat = deft_buildup.density_table({1: [_res("topk", 1, 0.01)], 2: [_res("topk", 2, 0.01)]})
    assert deft_buildup.evaluate(flat, [])[0].holds is False
    drift = deft_buildup.density_table({2: [_res("deft", 2, 0.02)]})
    assert deft_buildup.evaluate(drift, [])[-1].holds is False


def _phases(select, idx, vals, step):
    return {"phases": {"select": select, "exchange_indices": idx, "exchange_values": vals}, "step_seconds": step}


def test_deft_breakdown_claims():
    rows = deft_breakdown.breakdown_rows([_res("topk", 2, 0.002, **_phases(0.04, 0.01, 0.01, 0.07)),
                                          _res("cltk", 2, 0.001, **_phases(0.03, 0.01, 0.005, 0.05)),
                                          _res("deft", 2, 0.001, **_phases(0.02, 0.008, 0.004, 0.04))])
    assert rows[0]["communication"] == pytest.approx(20.0)
    fused = deft_breakdown.breakdown_rows([_res("topk", 2, 0.002, phases={"compensate": 0.01, "select": 0.002},
                                                step_seconds=0.02)])
    assert fused[0]["selection"] == pytest.approx(12.0)  # the fused candidate search is inside compensate
    assert [c.holds for c in deft_breakdown.evaluate(rows)] == [True, True, True]
    rows[2]["selection"] = 50.0  # compensate + select: the selection work wherever it is timed
    assert deft_breakdown.evaluate(rows)[0].holds is False


def test_deft_speedup_claims():
    rows = [{"world_size": w, "speedup_measured": s} for w, s in ((1, 0.9), (2, 2.5), (4, 4.5))]
    inc, lin = deft_speedup.evaluate(rows)
    assert inc.holds is True and lin.holds is True and "1.25 W (W=2)" in lin.measured
    rows[2]["speedup_measured"] = 3.0
    assert deft_speedup.evaluate(rows)[1].holds is False
    rows[2]["speedup_measured"] = 4.2  # 4.2 vs W=4: within 10%, too close to call
    assert deft_speedup.evaluate(rows)[1].verdict == "noise"
    rows[2]["speedup_measured"] = 2.6  # 2.5 -> 2.6: not a clear increase, and no clear fall
    inc = deft_speedup.evaluate(rows)[0]
    assert inc.verdict == "noise" and "W=2 -> 4: 2.50x -> 2.60x, a rise of 1.04x within the noise band" in inc.note


def test_deft_speedup_pairs_the_jobs_so_the_topk_calls_noise_cancels():
    """Each job divides every W's DEFT time into the same top-k time: the rise from W to W' is judged job by job.

    The numbers are one recorded quick run's W=1 and W=2 (three jobs): unpaired, the speedups' spread (0.42 to
    0.50 at W=1, mostly the top-k call's) swallows a 15% rise; paired, every job rises by 15-27%."""
    def row(w, topk, deft, imb=1.0):
        sp = [t / d for t, d in zip(topk, deft)]
        return {"world_size": w, "speedup_measured": sorted(sp)[1], "speedup_measured_samples": sp,
                "imbalance": imb, "imbalance_samples": [imb] * 3}

    topk = [12.43, 13.8, 12.77]
    rows = [row(1, topk, [26.96, 27.5, 30.45]), row(2, topk, [23.49, 22.14, 24.03], 1.03)]
    from mpisparse.reproduce.base import time_verdict

    assert time_verdict(rows[0]["speedup_measured_samples"], rows[1]["speedup_measured_samples"]).holds is None
    inc = deft_speedup.evaluate(rows)[0]
    assert inc.verdict == "yes" and "W=1 -> 2 1.24, band 0.12" in inc.note
    rows[1]["speedup_measured_samples"] = [0.48, 0.62, 0.43]  # rises of 3%, 4% and 24%: median 4%, within noise
    assert deft_speedup.evaluate(rows)[0].verdict == "noise"
    rows[1]["speedup_measured_samples"] = [0.40, 0.44, 0.37]  # every job falls by 12-13%
    assert deft_speedup.evaluate(rows)[0].verdict == "no"


def _cltk_run(w, lr, beta, cos, ham):
    return {"world_size": w, "config": {"lr": lr, "scheme.beta": beta}, "metrics": {"final": {"test_accuracy": 0.9}},
            "diagnostics": {"per_step": [{"memory_cosine_distance": c, "hamming_to_true_topk": h}
                                         for c, h in zip(cos, ham)]}}


def test_scalecom_similarity_claims():
    assert scalecom_similarity.epochs_for(90, 2) == 4 and scalecom_similarity.epochs_for(90, 4) == 8
    down = [0.3, 0.1] + [0.05] * 18
    base = [scalecom_similarity.summary(_cltk_run(w, 0.1, 1.0, down, [0.7] * 20)) for w in (2, 4)]
    assert base[0]["cos_first"] == 0.3 and base[0]["cos_late"] == pytest.approx(0.05)
    scaled = scalecom_similarity.summary(_cltk_run(2, 0.3, 1.0, [0.3] * 20, [0.5] * 20))
    filtered = scalecom_similarity.summary(_cltk_run(2, 0.3, 0.1, [0.2] * 20, [0.5] * 20))
    claims = scalecom_similarity.evaluate(base, scaled, filtered)
    assert [c.source for c in claims] == ["Fig. 2(a)", "Fig. 2(a)", "Fig. 2(c), Sec. 3", "Fig. 2(c), Sec. 3",
                                          "Fig. 3"]
    assert [c.holds for c in claims] == [True, True, True, True, True]
    base[1]["hamming_mean"] = 0.4
    assert scalecom_similarity.evaluate(base, scaled, filtered)[-1].holds is False


def test_dct_threshold_deviation_and_claims():
    st = dct_threshold.deviation_stats([1.0, 3.0, 2.0])  # running means 1, 2, 2
    assert st["max"] == pytest.approx(0.5) and st["median"] == pytest.approx(0.0)

    def run(d, taus):
        return {"density_target": d, "metrics": {"final": {"test_accuracy": 0.9}},
                "diagnostics": {"per_step": [{"tau_largest_layer": t} for t in taus]}}

    trows = dct_threshold.threshold_rows([run(0.01, [3.0, 3.1, 2.9]), run(0.05, [1.0, 1.1, 0.9])])
    assert [r["sparsity"] for r in trows] == [pytest.approx(0.95), pytest.approx(0.99)]

    def job(dense, dct, sel, density):
        return [{"scheme": "dense", "step_seconds": dense, "phases": {}, "density_actual": 1.0,
                 "bytes_sent_per_rank": 8.0},
                {"scheme": "dct", "step_seconds": dct, "phases": {"select": sel}, "density_actual": density,
                 "bytes_sent_per_rank": 1.0}]

    lrows = dct_threshold.lifespan_rows({1: job(1.0, 1.2, 0.3, 0.05), 1000: job(1.0, 0.8, 0.05, 0.07)})
    claims = dct_threshold.evaluate(trows, lrows)
    assert [c.source for c in claims] == ["Fig. 2"] * 2 + ["Fig. 8a"] * 3
    assert [c.holds for c in claims] == [True, True, True, True, True]
    assert "+20% step time" in claims[2].measured and "+25% speed" in claims[3].measured
    close = dct_threshold.evaluate(trows, dct_threshold.lifespan_rows({1: job(1.0, 1.05, 0.3, 0.05)}))[2]
    assert close.verdict == "noise" and "linear-time selection" in close.note


def test_slimdp_traffic_claims():
    def ps(scheme, up, comm, step):
        return {"scheme": scheme, "world_size": 3, "workers": 2, "bytes_sent_per_rank": up,
                "bytes_up_per_communication": up, "bytes_down_per_communication": up, "step_seconds": step,
                "phases": {},
                "phases_worker": {p: {"max": comm / 3, "mean": comm / 3} for p in ("push", "wait", "pull")}}

    rows = slimdp_traffic.traffic_rows([("vgg16", 0.2, 0.1, [ps("plumpdp", 1000.0, 0.3, 1.0),
                                                              ps("slimdp", 300.0, 0.1, 0.8)])])
    assert rows[0]["up_ratio"] == pytest.approx(0.3) and rows[0]["saving"] == pytest.approx(2 / 3)
    assert [c.holds for c in slimdp_traffic.evaluate(rows)] == [True, True, True]
    rows[0]["up_ratio"] = 0.35
    assert slimdp_traffic.evaluate(rows)[0].holds is False


def test_dgs_speedup_claims(tmp_path):
    from mpisparse.results import CsvLog

    log = tmp_path / "log.csv"  # written the way train --csv writes it (wall clock in ms)
    writer = CsvLog(log)
    for i in range(20):
        for scheme, dt, dens in (("asgd", 0.1, 1.0), ("dgs", 0.01, 0.01)):
            writer.row(scheme, {"epoch": 0, "batch": i, "iteration": i + 1, "loss": 2.0 - 0.05 * i,
                                "step_seconds": dt, "wall_seconds": dt * (i + 1), "bytes": 1, "density": dens,
                                "skipped": False})
    writer.close()
    assert "wall_ms" in log.read_text().splitlines()[0]
    logs = dgs_speedup.read_loss_log(log)
    assert len(dgs_speedup.smoothed(logs["asgd"])) == 11
    assert dgs_speedup.time_to_loss(logs["dgs"], 10.0) == pytest.approx(0.1)
    old = tmp_path / "old.csv"  # a log written before the columns carried units
    old.write_text("scheme,epoch,batch,iteration,loss,step_seconds,wall_seconds,bytes,density,skipped\n"
                   "dgs,0,0,1,2.0,0.01,0.25,1,0.01,False\n")
    assert dgs_speedup.read_loss_log(old) == {"dgs": [(0.25, 2.0)]}

    def res(scheme, accs, walls, step):
        return {"scheme": scheme, "world_size": 3, "workers": 2, "step_seconds": step, "bytes_sent_per_rank": 1.0,
                "metrics": {"per_epoch": [{"test_accuracy": a, "wall_seconds": w} for a, w in zip(accs, walls)],
                            "final": {"test_accuracy": accs[-1], "train_loss": 0.1}}}

    results = [res("asgd", [0.8, 0.9], [1.0, 2.0], 0.1), res("dgs", [0.85, 0.93], [0.1, 0.2], 0.01)]
    target_loss, target_acc = dgs_speedup.common_targets(results, logs, 0.95)
    assert target_loss == pytest.approx(2.0 - 0.05 * 14.5) and target_acc == 0.9
    rows = dgs_speedup.run_rows(results, logs, target_loss, target_acc)
    claims = dgs_speedup.evaluate(rows, target_loss, target_acc, "emulated cluster: ...")
    assert [c.holds for c in claims] == [True, True, True]
    assert claims[0].measured.startswith("10.00x") and "emulated cluster" in claims[1].measured


# --------------------------------------------------------------------------- runs
def test_deft_speedup_runs_end_to_end_in_its_smallest_form(tmp_path):
    """Run from a fresh working directory, as a user would: the runs' JSON stays in a named directory there,
    and every path the output names exists afterwards."""
    j = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    env["MPISPARSE_QUICK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "mpisparse", "reproduce", "deft-speedup", "--quick", "--json",
                           str(j), "--markdown"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    [runs] = list((tmp_path / "mpisparse-results").glob("reproduce-*"))
    assert re.fullmatch(r"reproduce-\d{8}T\d{6}Z", runs.name)
    assert f"the underlying runs' JSON is in {os.path.join('mpisparse-results', runs.name)}" in proc.stdout
    named = re.findall(r"--json (\S+)", proc.stdout)
    assert named and all((tmp_path / p).is_file() for p in named), named
    assert "$ OMP_NUM_THREADS=1 mpisparse bench select --mode deft --model lstm-wt2 --worlds 1,2,4" in proc.stdout
    assert "claim vs measured" in proc.stdout and "| source | paper's claim |" in proc.stdout
    rep = json.loads(j.read_text())
    assert rep["target"] == "deft-speedup" and rep["size"] == "tiny" and rep["skipped"] is None
    assert [c["source"] for c in rep["claims"]] == ["Fig. 9, Sec. 5.4", "Sec. 5.4, eq. 9", "Sec. 5.4 (bound)"]
    # the toolkit's kernel, then the paper's primitive (torch.topk) for eq. 9
    assert len(rep["commands"]) == 2 and rep["machine"]["cpu_count"] >= 1
    assert "--select-kernel torch" in rep["commands"][1] and "with torch.topk" in rep["claims"][1]["measured"]


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_reproduce_target_quick(name, tmp_path):
    """``reproduce NAME --quick`` (CI: MPISPARSE_QUICK=1, the smallest form); prints the claim table."""
    j = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    proc = subprocess.run([sys.executable, "-m", "mpisparse", "reproduce", name, "--quick", "--json", str(j),
                           "--timeout", "600", "--out", str(tmp_path / "runs")], capture_output=True, text=True, timeout=1200, cwd=HERE.parent,
                          env=env)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(j.read_text())
    if rep["skipped"]:
        pytest.skip(rep["skipped"])
    assert rep["claims"] and rep["commands"]
    assert proc.stdout.count("$ ") == len(rep["commands"])
    for c in rep["claims"]:
        assert c["source"] and c["claim"] and c["paper"] and c["measured"]
        assert c["holds"] in (True, False, None)
        assert c["holds"] is not False or "holds =" in c["note"], f"a 'no' without its cause: {c}"


def test_time_verdicts_use_medians_and_a_noise_margin():
    from mpisparse.reproduce.base import Report, claims_summary, median, time_less

    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert time_less([1.0, 9.0, 1.1], [2.0, 2.1, 0.1]) == (True, False)  # medians 1.1 vs 2.0: one outlier each
    assert time_less([2.0], [1.0]) == (False, False)
    assert time_less([1.0], [1.05]) == (None, True)  # 5% apart: too close to call
    assert time_less([1.0], [1.05], margin=0.01) == (True, False)
    c = Claim("s", "c", "p", "m", None, within_noise=True)
    assert c.verdict == "noise" and "noise" in format_claims([c]) and claims_markdown([c]).endswith("| noise |")
    rep = Report("t", "title", "seed", "quick", claims=[c, Claim("s", "c", "p", "m", True),
                                                           Claim("s", "c", "p", "m", False)])
    assert claims_summary([rep]) == "claims: 1 hold, 1 do not, 1 within noise, 0 not comparable (3 in all)"


def test_the_noise_band_widens_with_the_repeats_spread_and_narrows_with_their_number():
    from mpisparse.reproduce.base import all_hold, spread, time_verdict

    assert spread([1.0, 1.1, 9.0]) == pytest.approx(0.1) and spread([5.0]) == 0.0  # one outlier does not widen it
    quiet = time_verdict([3.3, 3.4, 3.35], [3.9, 4.0, 3.95])  # 15% apart, repeats agree: judged
    assert quiet.holds is True and quiet.band == pytest.approx(0.395)
    noisy = time_verdict([3.3, 6.0, 4.4], [3.3, 4.3, 3.9])  # 13% apart, but the repeats disagree by more
    assert noisy.holds is None and noisy.within_noise and noisy.band == pytest.approx(3 * (1.1 + 0.4) / 3 ** 0.5)
    more = time_verdict([3.3, 6.0, 4.4] * 4, [3.3, 4.3, 3.9] * 4)  # four times the repeats: the medians are surer,
    assert more.band == pytest.approx(noisy.band / 2)  # the band half as wide (the spread itself does not shrink)
    many = time_verdict([3.3, 6.0, 4.4] * 48, [3.3, 4.3, 3.9] * 48)  # 144 each: down to the 10% floor, and the
    assert many.holds is False and many.band == pytest.approx(0.44)  # 0.5 between the medians is judged
    assert time_verdict([6.0, 6.2, 5.9], [3.9, 4.0, 4.1]).holds is False  # 50% above, repeats close: "no"
    assert "differ by 0.6, noise band 0.4" in quiet.text()
    yes, no, close = time_verdict(1, 2), time_verdict(2, 1), time_verdict(1, 1.05)
    assert all_hold([yes, yes]) is True and all_hold([yes, no]) is False and all_hold([yes, close]) is None
    assert all_hold([close, no]) is False and all_hold([]) is None


def test_deft_breakdown_takes_medians_of_repeated_jobs_and_calls_close_times_noise():
    def job(deft_select):
        return deft_breakdown.breakdown_rows([_res("topk", 2, 0.002, **_phases(0.04, 0.01, 0.01, 0.07)),
                                              _res("cltk", 2, 0.001, **_phases(0.03, 0.01, 0.005, 0.05)),
                                              _res("deft", 2, 0.001, **_phases(deft_select, 0.008, 0.004, 0.04))])
    rows = deft_breakdown.median_rows([job(0.02), job(0.09), job(0.021)])  # one noisy job: the median ignores it
    assert rows[2]["select"] == pytest.approx(21.0) and len(rows[2]["select_samples"]) == 3
    assert rows[2]["selection"] == pytest.approx(21.0)  # no compensate phase in these rows
    sel = deft_breakdown.evaluate(rows)[0]
    assert sel.holds is True and not sel.within_noise and "holds = the median of DEFT's time below each of topk, cltk" in sel.note
    rows = deft_breakdown.median_rows([job(0.0295)])  # 29.5 ms vs cltk's 30 ms
    sel = deft_breakdown.evaluate(rows)[0]
    assert sel.holds is None and sel.within_noise and sel.verdict == "noise"


def test_deft_speedup_states_the_linear_time_bound():
    rows = [{"world_size": w, "speedup_measured": s, "imbalance": i} for w, s, i in ((1, 1.0, 1.0), (4, 3.0, 1.2),
                                                                                    (16, 12.0, 1.25))]
    inc, lin, bound = deft_speedup.evaluate(rows)
    assert lin.holds is False and "W / imbalance" in lin.note
    assert bound.holds is True and "12.00x of bound 12.80x (W=16)" in bound.measured
    rows[2]["speedup_measured"] = 9.0
    assert deft_speedup.evaluate(rows)[2].holds is False
