"""The cost model (``mpisparse/bench/costmodel.py``) and ``mpisparse bench model``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mpisparse.bench import costmodel as cm

RATES = cm.Rates(stream=1e-9, topk=2e-9, fused=1.2e-9, scatter=1e-8, segmented=3e-9, pick=4e-8, merge=3e-8)
LINK = cm.Link(latency=50e-6, bandwidth=1.25e8)  # 1 Gbit/s


def test_dense_is_the_halving_doubling_allreduce_plus_a_scaling_pass():
    n, W = 1_000_000, 8
    ph = cm.predict("dense", n, 0.01, W, LINK, RATES)
    assert ph["exchange"] == pytest.approx(2 * 3 * 50e-6 + 2 * 7 / 8 * 4 * n / 1.25e8)
    assert ph["update"] == pytest.approx(1e-9 * n) and ph["compensate"] == 0 == ph["select"]


def test_topk_grows_with_W_and_cltk_does_not_build_up():
    n, d = 10_000_000, 0.001
    k = int(d * n)
    t16 = cm.predict("topk", n, d, 16, LINK, RATES)
    assert t16["exchange"] == pytest.approx(3 * 4 * 50e-6 + 15 * k * 8 / 1.25e8)
    assert t16["update"] == pytest.approx(1e-8 * 16 * k)  # the build-up: up to W k entries scattered
    c16 = cm.predict("cltk", n, d, 16, LINK, RATES)
    assert c16["update"] == pytest.approx(1e-8 * k)
    assert cm.total(cm.predict("topk", n, d, 1024, LINK, RATES)) > 10 * cm.total(cm.predict("cltk", n, d, 1024,
                                                                                         LINK, RATES))


def test_selection_costs_a_pick_per_selected_element_after_the_pass():
    n, d, W = 10_000_000, 0.01, 4
    k = int(d * n)
    t = cm.predict("topk", n, d, W, LINK, RATES)
    assert t["compensate"] == pytest.approx(1.2e-9 * n) and t["select"] == pytest.approx(4e-8 * k)
    c = cm.predict("cltk", n, d, W, LINK, RATES)  # the leader's pick: the others wait for it
    assert c["select"] == pytest.approx(4e-8 * k) and c["update"] == pytest.approx(1e-8 * k)
    f = cm.predict("deft", n, d, W, LINK, RATES)  # its share of the layers: 1.1 / 4 of the elements and of k
    assert f["compensate"] == pytest.approx(1e-9 * n * (1 - 1.1 / 4) + 3e-9 * n * 1.1 / 4)  # the candidate search
    assert f["select"] == pytest.approx(4e-8 * k * 1.1 / 4)
    old = cm.Rates(stream=1e-9, topk=2e-9, fused=1.2e-9, scatter=1e-8, segmented=3e-9)  # pick, merge default 0
    assert cm.predict("topk", n, d, W, LINK, old)["select"] == 0


def test_gtopk_merges_and_exchanges_both_ways_once_per_round():
    n, d, W = 10_000_000, 0.01, 8
    k = int(d * n)
    g = cm.predict("gtopk", n, d, W, LINK, RATES)
    # three rounds: each a sendrecv of k indices + k values, both directions at once, and a merge of 2k
    assert g["exchange"] == pytest.approx(3 * (2 * 50e-6 + k * 8 / 1.25e8))
    assert g["select"] == pytest.approx(4e-8 * k + 3e-8 * 2 * k * 3)


def test_bcast_is_a_tree_when_short_and_scatter_allgather_when_long():
    n, W = 10_000_000, 8
    k = int(0.01 * n)  # 400 kB of indices: long
    c = cm.predict("cltk", n, 0.01, W, LINK, RATES)
    bcast = 2 * 3 * 50e-6 + 2 * 7 / 8 * 4 * k / 1.25e8
    allreduce = 2 * 3 * 50e-6 + 2 * 7 / 8 * 4 * k / 1.25e8
    assert c["exchange"] == pytest.approx(bcast + allreduce)
    small = cm.predict("cltk", 100_000, 0.01, W, LINK, RATES)  # k = 1,000: 4 kB, below 12 KiB: a binomial tree
    assert small["exchange"] == pytest.approx(3 * (50e-6 + 4000 / 1.25e8) + 2 * 3 * 50e-6
                                              + 2 * 7 / 8 * 4000 / 1.25e8)
    dft = cm.predict("deft", n, 0.01, W, LINK, RATES)  # counts + indices, values (bins packed once: no Bcast)
    assert dft["exchange"] == pytest.approx(2 * 3 * 50e-6 + 7 / 8 * k * 4 / 1.25e8 + allreduce)


def test_deft_bins_bcast_is_costed_only_when_the_leader_packs(monkeypatch):
    from mpisparse.schemes import deft
    n, W = 10_000_000, 8
    size = cm.predict("deft", n, 0.01, W, LINK, RATES)["exchange"]
    monkeypatch.setattr(deft, "PACK_COST", "eq3")
    assert cm.predict("deft", n, 0.01, W, LINK, RATES)["exchange"] == pytest.approx(size + 3 * 50e-6)


def test_one_rank_sends_nothing_and_shared_cores_stretch_compute():
    assert cm.predict("topk", 1000, 0.1, 1, LINK, RATES)["exchange"] == 0
    a = cm.predict("deft", 10**6, 0.01, 8, LINK, RATES)
    b = cm.predict("deft", 10**6, 0.01, 8, LINK, RATES, shared_cores=2)
    assert b["compensate"] == pytest.approx(4 * a["compensate"]) and b["exchange"] == a["exchange"]


def test_sharing_runs_min_of_ranks_and_cores_at_once_and_stretches_by_ranks_per_core():
    assert cm.sharing(8, 2) == (2, 4.0)
    assert cm.sharing(2, 2) == (2, 1.0)
    assert cm.sharing(3, 2) == (2, 1.5)
    assert cm.sharing(1, 2) == (1, 1.0)  # one rank: alone, a core of its own
    assert cm.sharing(16, None) == (1, 1.0)  # a core per rank
    with pytest.raises(ValueError, match="shared cores 0; it must be >= 1"):
        cm.sharing(4, 0)
    with pytest.raises(ValueError, match="world size 0"):
        cm.sharing(0, 2)


def test_shared_cores_stretch_every_compute_phase_and_not_the_link():
    n, d = 10**6, 0.01
    for s in cm.SCHEMES:
        a = cm.predict(s, n, d, 8, LINK, RATES)
        b = cm.predict(s, n, d, 8, LINK, RATES, shared_cores=2)
        for phase in ("compensate", "select", "update"):
            assert b[phase] == pytest.approx(4 * a[phase]), (s, phase)
        assert b["exchange"] == a["exchange"]
    slow = cm.Rates(stream=2e-9, topk=2e-9, fused=2.4e-9, scatter=1e-8, segmented=3e-9, pick=4e-8, merge=3e-8)
    w4 = cm.predict("topk", n, d, 4, LINK, slow, shared_cores=2)  # rates of 2 processes at once, 2 ranks a core
    assert w4["compensate"] == pytest.approx(2 * 2.4e-9 * n)
    assert cm.predict("dense", n, d, 2, LINK, slow, shared_cores=2)["update"] == pytest.approx(2e-9 * n)


def test_slowest_takes_the_max_over_processes_of_the_repetitions_run_at_once():
    runs = [{"stream": [(0.0, 1.0, 1), (10.0, 15.0, 1), (20.0, 22.0, 1)]},
            {"stream": [(0.0, 3.0, 1), (10.0, 11.0, 1), (20.0, 22.5, 1)]}]
    assert cm.slowest(runs) == {"stream": [3.0, 5.0, 2.5]}  # per repetition, not the max of medians
    calls = [{"k": [(0.0, 1.0, 4)]}, {"k": [(0.1, 1.1, 5)]}]  # seconds per call: the fewer calls, the slower
    assert cm.slowest(calls) == {"k": [0.25]}
    one_after_other = [{"stream": [(0.0, 1.0, 1), (5.0, 6.0, 1)]}, {"stream": [(1.0, 2.0, 1), (5.5, 6.5, 1)]}]
    assert cm.slowest(one_after_other) == {"stream": [1.0]}  # the first did not run at once: left out
    assert cm.slowest(one_after_other, overlap=0.6) == {"stream": [1.0, 1.0]}  # none at once: all count
    assert cm.slowest(one_after_other, overlap=0.0) == {"stream": [1.0, 1.0]}  # touching spans count
    with pytest.raises(ValueError, match=r"kernel stream: the processes timed \[1, 3\] repetitions"):
        cm.slowest([{"stream": [(0.0, 1.0, 1)]}, runs[0]])
    with pytest.raises(ValueError, match="no process"):
        cm.slowest([])
    with pytest.raises(ValueError, match="overlap 2; allowed"):
        cm.slowest(runs, overlap=2)


def test_rates_are_the_fastest_repetition_per_element():
    names = ("stream", "topk", "fused", "scatter", "segmented", "pick", "merge")
    times = {k: [3.0, 1.0, 8.0] for k in names}  # a slow repetition (other work) does not count
    r = cm.rates_from_times(times, {k: 4 if k in ("pick", "scatter", "merge") else 2 for k in names})
    assert r.stream == 0.5 and r.pick == 0.25 and r.merge == 0.25
    with pytest.raises(ValueError, match=r"kernels \['odd'\] have no element count"):
        cm.rates_from_times({"odd": [1.0]}, {"stream": 1})


def test_crossover_where_topk_overtakes_dense():
    n = 25_000_000
    w1, w2 = cm.crossover(n, 0.01, LINK, RATES), cm.crossover(n, 0.001, LINK, RATES)
    assert w1 is not None and w2 is not None and w1 < w2  # sparser: later
    assert cm.total(cm.predict("topk", n, 0.01, w1, LINK, RATES)) > cm.total(cm.predict("dense", n, 0.01, w1,
                                                                                        LINK, RATES))
    assert cm.total(cm.predict("topk", n, 0.01, w1 // 2, LINK, RATES)) <= cm.total(
        cm.predict("dense", n, 0.01, w1 // 2, LINK, RATES))


def test_fit_link_recovers_latency_and_bandwidth():
    pts = [(4, k, 3 * 2 * 80e-6 + 3 * k * 8 / 5e8) for k in (1000, 10_000, 100_000)]
    link = cm.fit_link(pts)
    assert link.latency == pytest.approx(80e-6, rel=1e-6) and link.bandwidth == pytest.approx(5e8, rel=1e-6)
    with pytest.raises(ValueError, match="2 or more densities"):
        cm.fit_link(pts[:1])
    vals = [(2, k, 60e-6 + k * 4 / 1.2e8) for k in (1000, 100_000)]  # the values' Allgatherv alone
    one = cm.fit_link(vals, messages=1, bytes_per_element=4)
    assert one.latency == pytest.approx(60e-6, rel=1e-6) and one.bandwidth == pytest.approx(1.2e8, rel=1e-6)


def test_link_from_exchange_fits_the_values_phase_when_there(tmp_path):
    from mpisparse.bench import model as bm

    rows = [{"scheme": "topk", "world_size": 2, "k": k, "exchange_seconds": 1.0 + k,  # waits: not the link's
             "exchange_phases": {"exchange_indices": 1.0, "exchange_values": 60e-6 + k * 4 / 1.2e8}}
            for k in (1000, 100_000)]
    p = tmp_path / "x.json"
    p.write_text(json.dumps(rows))
    link = bm.link_from_exchange(str(p))
    assert link.bandwidth == pytest.approx(1.2e8, rel=1e-6) and link.latency == pytest.approx(60e-6, rel=1e-6)
    for r in rows:
        del r["exchange_phases"]
    p.write_text(json.dumps(rows))  # older results: the whole exchange, three messages per step
    whole = bm.link_from_exchange(str(p))  # t = 1 + k = 3 a + 8 k b: a = 1/3 s, b = 1/8 s per byte
    assert whole.bandwidth == pytest.approx(8.0) and whole.latency == pytest.approx(1 / 3)


@pytest.mark.parametrize("text,value", [("1gbit", 1.25e8), ("100mbit", 1.25e7), ("2.5e9", 2.5e9)])
def test_parse_rate(text, value):
    assert cm.parse_rate(text) == pytest.approx(value)


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match="link rate 'fast'"):
        cm.parse_rate("fast")
    with pytest.raises(ValueError, match="scheme 'dgc' is not in the cost model; allowed: dense, topk"):
        cm.predict("dgc", 10, 0.1, 2, LINK, RATES)
    with pytest.raises(ValueError, match="link bandwidth is 0"):
        cm.Link(latency=0.0, bandwidth=0)


def test_measured_rates_are_positive_and_finite():
    r = cm.measure_rates(n=1 << 18, repeats=1)
    for v in cm.rates_dict(r).values():
        assert 0 < v < 1e-3 and math.isfinite(v)
    with pytest.raises(ValueError, match="densities 0.01 and 0.01; allowed"):
        cm.measure_rates(n=1 << 12, density=0.01)
    with pytest.raises(ValueError, match="processes 0; it must be >= 1"):
        cm.measure_rates(n=1 << 12, processes=0)


def test_rates_timed_in_processes_at_once():
    """Two processes, each on its own vectors, every repetition started together: the slowest's time."""
    g = np.random.default_rng(1).standard_normal(1 << 18).astype(np.float32)
    r = cm.measure_rates(repeats=2, processes=2, grad=g)
    for v in cm.rates_dict(r).values():
        assert 0 < v < 1e-3 and math.isfinite(v)
    assert g[0] == np.random.default_rng(1).standard_normal(1).astype(np.float32)[0]  # the caller's untouched


def test_run_model_predicts_measured_points_with_rates_of_the_ranks_at_once():
    from mpisparse.bench import model as bm

    alone = RATES
    both = cm.Rates(**{k: 2 * v for k, v in cm.rates_dict(RATES).items()})
    asked = []

    def rates_at(p):
        asked.append(p)
        return both

    measured = [{"scheme": "topk", "world_size": w, "density_target": 0.01, "n": 10**6, "step_seconds": 1.0}
                for w in (2, 4, 8)]
    res = bm.run_model(model="ncf", densities=[0.01], worlds=[2], link=LINK, rates=alone, shared_cores=2,
                       measured=measured, rates_at=rates_at)
    assert asked == [2]  # measured once, for every W >= 2 cores
    for v in res["validation"]:
        w = v["world_size"]
        assert v["predicted_seconds"] == pytest.approx(cm.total(cm.predict("topk", 10**6, 0.01, w, LINK, both,
                                                                            shared_cores=2)))
    assert res["rates_at_once_seconds_per_element"]["2"]["stream"] == pytest.approx(2e-9)
    [p] = [p for p in res["predictions"] if p["scheme"] == "topk"]  # the curves: a core per rank, rates alone
    assert p["step_seconds"] == pytest.approx(cm.total(cm.predict("topk", bm.model_size("ncf"), 0.01, 2, LINK,
                                                                  alone)))
    with pytest.raises(ValueError, match="needs rates of 2 processes at once"):
        bm.run_model(model="ncf", densities=[0.01], worlds=[2], link=LINK, rates=alone, shared_cores=2,
                     measured=measured)


def test_loaded_rates_are_a_roofline_on_the_floor_of_the_steps_moment():
    both = cm.Rates(**{k: 2 * v for k, v in cm.rates_dict(RATES).items()})
    slow = cm.loaded_rates(RATES, both, 4e-9)  # a loaded moment: the fused passes are bandwidth-bound
    assert slow.stream == slow.fused == slow.segmented == 4e-9
    quick = cm.loaded_rates(RATES, both, 0.5e-9)  # a quiet one: compute-bound, at their rates alone
    assert quick.stream == 0.5e-9 and (quick.fused, quick.segmented) == (RATES.fused, RATES.segmented)
    for r in (slow, quick):  # the kernels bound by cache misses or a third of the bytes keep their rates at once
        assert (r.topk, r.pick, r.scatter, r.merge) == (both.topk, both.pick, both.scatter, both.merge)
    with pytest.raises(ValueError, match="floor is 0 s per element"):
        cm.loaded_rates(RATES, both, 0)


def test_a_measured_floor_predicts_its_point_at_that_moment_and_leaves_the_link():
    from mpisparse.bench import model as bm

    both = cm.Rates(**{k: 2 * v for k, v in cm.rates_dict(RATES).items()})
    n = 10**6
    # W = 4 on 2 cores: each rank has half a core, so its floor pass took twice 3 ns per element
    point = {"scheme": "topk", "world_size": 4, "density_target": 0.01, "n": n, "step_seconds": 1.0,
             "floor": {"seconds": 2 * n * 3e-9, "seconds_median": 0.0}}
    assert bm.floor_rate(point, 2) == pytest.approx(3e-9)
    assert bm.floor_rate({**point, "world_size": 2}, 2) == pytest.approx(6e-9)
    assert bm.floor_rate({**point, "floor": None}, 2) is None
    res = bm.run_model(model="ncf", densities=[0.01], worlds=[2], link=LINK, rates=RATES, shared_cores=2,
                       measured=[point, {**point, "world_size": 2, "floor": None}], rates_at=lambda p: both)
    with_floor, without = res["validation"]
    at = cm.predict("topk", n, 0.01, 4, LINK, cm.loaded_rates(RATES, both, 3e-9), shared_cores=2)
    plain = cm.predict("topk", n, 0.01, 4, LINK, both, shared_cores=2)
    assert with_floor["floor_seconds_per_element"] == pytest.approx(3e-9)
    assert with_floor["predicted_seconds_floor"] == pytest.approx(cm.total(at))
    assert with_floor["error_floor"] == pytest.approx(cm.total(at) - 1.0)
    assert with_floor["predicted_seconds"] == pytest.approx(cm.total(plain))  # the plain prediction stays
    assert at["exchange"] == plain["exchange"] and at["compensate"] == pytest.approx(plain["compensate"] * 3 / 2.4)
    assert "error_floor" not in without
    assert with_floor["split_floor"] == pytest.approx({"compute": cm.total(at) - at["exchange"],
                                                       "exchange": at["exchange"]})
    assert "split_measured" not in with_floor  # the point has no phases
    phased = {**point, "phases": {"compensate": 0.2, "select": 0.1, "update": 0.05, "exchange_indices": 0.3,
                                  "exchange_values": 0.25, "wait": 0.1}}
    [v] = bm.run_model(model="ncf", densities=[0.01], worlds=[2], link=LINK, rates=RATES, shared_cores=2,
                       measured=[phased], rates_at=lambda p: both)["validation"]
    assert v["split_measured"] == pytest.approx({"compute": 0.35, "exchange": 0.65})
    text = bm.format_model(res)
    assert "at the floor ms" in text and "3.00" in text


@pytest.mark.mpi  # its provenance reads the MPI library in this process
def test_bench_model_cli_validates_against_measured_steps(tmp_path):
    """The command end to end: predictions, crossover, a validation row per measured step, JSON, CSV, plot."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from mpisparse.cli import cli as main
    from test_plots import assert_not_blank

    measured = tmp_path / "m.json"
    measured.write_text(json.dumps([{"scheme": "dense", "world_size": 4, "density_target": 0.01, "n": 25_557_032,
                                     "step_seconds": 1.4}, {"scheme": "ps-only", "step_seconds": 1.0}]))
    out = CliRunner().invoke(main, ["bench", "model", "--worlds", "2,4,1024", "--measured", str(measured),
                                    "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                                    "--plot", str(tmp_path / "p.png")])
    assert out.exit_code == 0, out.output
    assert "predicted step ms, density 0.01 (top-k slower than dense from W = " in out.output
    res = json.loads((tmp_path / "r.json").read_text())
    assert len(res["predictions"]) == 2 * 3 * len(cm.SCHEMES)
    [v] = res["validation"]
    assert v["scheme"] == "dense" and v["world_size"] == 4
    assert v["error"] == pytest.approx((v["predicted_seconds"] - 1.4) / 1.4)
    assert (tmp_path / "r.csv").read_text().count("\n") == 1 + len(res["predictions"])
    assert_not_blank(tmp_path / "p.png")
    bad = CliRunner().invoke(main, ["bench", "model", "--rate", "fast"])
    assert bad.exit_code == 2 and "link rate 'fast'" in bad.output


def test_cost_model_table_names_both_sets_of_rates_and_counts_the_band():
    from docs_results import _cost_model_render

    val = [{"scheme": "topk", "density": 0.01, "world_size": w, "predicted_seconds": p, "measured_seconds": 1.0,
            "error": p - 1.0} for w, p in ((2, 1.1), (4, 0.79), (8, 1.2))]
    res = {"model": {"model": "resnet50", "n": 10, "link": {"bytes_per_second": 1.25e8, "latency_seconds": 0},
                     "rates_seconds_per_element": {"stream": 2.6e-10},
                     "rates_at_once_seconds_per_element": {"2": {"stream": 5.1e-10}}, "shared_cores": 2,
                     "validation": val, "topk_slower_than_dense_at_world": {"0.01": 128}}}
    text = _cost_model_render(res, False)
    assert "one process alone: stream 0.26" in text and "2 processes at once (the slowest of them): stream 0.51" in text
    assert "2 of 3 predictions within 20%" in text  # -21% is out, +20% is in
    assert "; 0 of 0 at the floor of the step's own job" in text  # no floors: that column stays empty
    val[1].update(floor_seconds_per_element=4.4e-10, predicted_seconds_floor=0.95, error_floor=-0.05)
    text = _cost_model_render(res, False)
    assert "| `topk` | 0.01 | 4 | 790.0 | 1,000.0 | -21% | 0.44 | 950.0 | -5% |" in text
    assert "; 1 of 1 at the floor of the step's own job" in text
    assert "Where the error at the floor lies" not in text  # no split: no sentence
    val[1].update(split_floor={"compute": 0.5, "exchange": 0.45}, split_measured={"compute": 0.52, "exchange": 0.48})
    val[2].update(split_floor={"compute": 0.6, "exchange": 0.3}, split_measured={"compute": 0.55, "exchange": 0.45})
    val[0].update(split_floor={"compute": 0.1, "exchange": 0.1}, split_measured={"compute": 0.1, "exchange": 0.1},
                  scheme="dense")  # dense's points are left out
    text = _cost_model_render(res, False)
    assert text.endswith("Where the error at the floor lies (the sparse schemes' points; measured minus predicted, "
                         "ms, each measured phase its max over ranks): W = 4 and 8: compute -50.0 to +20.0, "
                         "exchange +30.0 to +150.0.")
