"""``mpisparse advise``: the predicted step, time to target, winner and crossover (pure functions, no MPI),
and its refusals (one line, exit 2)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mpisparse.bench import advise as adv
from mpisparse.bench import advise_measured as am
from mpisparse.bench import costmodel as cm
from mpisparse.cli import cli

#: MPI here is one process at a time (a command without ``-n``): the unit lane (tests/conftest.py lane_of)
ONE_PROCESS_MPI = True

N = 11_689_512  # resnet18
LAT = 50e-6


def setting(**kw):
    base = dict(n=N, compute=1.0, world=2, hosts=2, density=0.01, hidden_share=0.35, powersgd_elements=N // 50)
    return adv.Setting(**{**base, **kw})


def link(bits):
    return cm.Link(latency=LAT, bandwidth=bits / 8)


def test_step_is_compute_plus_overhead_plus_the_exposed_exchange():
    s = setting()
    for label in adv.ADVISE_SCHEMES:
        st = adv.step_time(label, s, link(1e9))
        assert st["step"] == pytest.approx(st["compute"] + st["overhead"] + st["exchange"] - st["hidden"])
        assert st["exposed"] == pytest.approx(st["exchange"] - st["hidden"])
        assert (st["hidden"] > 0) == (label == adv.BASELINE)
    # 16-bit halves dense's bytes: the baseline's exchange is half of float32 dense's (latency aside)
    d32, d16 = (adv.step_time(x, s, link(1e9))["exchange"] for x in ("dense", adv.BASELINE))
    assert d16 == pytest.approx(d32 / 2, rel=1e-3)
    # dense float32 at W=2: the ring Allreduce moves n * 4 bytes each way
    assert d32 == pytest.approx(N * 4 / (1e9 / 8), rel=1e-3)


def test_overlap_hides_at_most_the_backward_window():
    s = setting(compute=0.1, hidden_share=0.9, window=0.5)
    slow = adv.step_time(adv.BASELINE, s, link(30e6))
    assert slow["hidden"] == pytest.approx(0.05)  # capped: 0.9 of a multi-second exchange > half of 0.1 s
    fast = adv.step_time(adv.BASELINE, s, link(100e9))
    assert fast["hidden"] == pytest.approx(0.9 * fast["exchange"])


def test_ranks_of_a_host_cross_its_nic_as_the_collectives_run():
    from mpisparse.bench import netmodel as nm

    intra = cm.Link(latency=1e-6, bandwidth=10e9 / 8)
    s = setting(world=4, hosts=2, intra=intra)
    lk = link(1e9)
    # float32 dense, flat: recursive halving and doubling; at distance 1 half the vector stays inside the host,
    # at distance 2 both ranks of a host send a quarter across its NIC; 2 log2(4) latencies
    m = 4 * N
    want = 2 * ((m / 2) / intra.bandwidth + 2 * (m / 4) / lk.bandwidth) + 4 * LAT
    assert adv.step_time("dense", s, lk)["exchange"] == pytest.approx(want)
    # topk's Allgathervs are rings: one block a round through each NIC, as with one rank a host
    one = adv.step_time("topk", setting(world=4, hosts=4), lk)["exchange"]
    assert adv.step_time("topk", s, lk)["exchange"] == pytest.approx(one)
    # two levels: Reduce in the host, the leaders' Allreduce, Bcast in the host (mpisparse/mpi/hierarchy.py)
    h = setting(world=4, hosts=2, intra=intra, hierarchical=True)
    t = nm.Topology(4, 2, lk, intra, hierarchical=True)
    assert adv.step_time("dense", h, lk)["exchange"] == pytest.approx(nm.collective("allreduce", t, m))
    assert adv.nic_bytes("dense", h) == pytest.approx(adv.nic_bytes("dense", s)) == pytest.approx(m)
    assert adv.nic_bytes("topk", s) == pytest.approx(3 * 8 * int(0.01 * N))  # 3 ring rounds of k indices + values
    models = {r["scheme"]: r["exchange_model"] for r in adv.advise(h, lk)["rows"]}
    assert models == {adv.BASELINE: "flat", "dense": "two-level", "topk": "two-level", "cltk": "two-level",
                      "deft": "two-level", "gtopk": "flat", "powersgd": "two-level", "oktopk": "flat"}
    # NCCL's dense: 16-bit, the shards across the hosts
    g = setting(world=4, hosts=2, intra=intra, dense_exchange="nccl")
    assert adv.step_time(adv.BASELINE, g, lk)["exchange"] == pytest.approx(nm.nccl_allreduce(
        nm.Topology(4, 2, lk, intra), 2 * N))
    assert {r["scheme"]: r["exchange_model"] for r in adv.advise(g, lk)["rows"]}["dense"] == "nccl"
    with pytest.raises(ValueError, match="need an intra-host link"):
        setting(world=4, hosts=2)
    with pytest.raises(ValueError, match="dense exchange 'gloo'"):
        setting(dense_exchange="gloo")


def test_a_rate_tables_fixed_costs_are_part_of_the_scheme_compute():
    r = cm.Rates(stream=1e-12, topk=1e-12, fused=2e-12, scatter=1e-10, segmented=3e-12, pick=1e-9, merge=1e-9,
                 per_call={"fused": 5e-5, "scatter": 2e-5})
    s = setting(world=4, hosts=4, rates=r, step_fixed={"topk": 1e-3})
    ph = adv.scheme_phases("topk", s, link(1e9))
    k = int(0.01 * N)
    assert ph["compensate"] == pytest.approx(5e-5 + 2e-12 * N) and ph["select"] == pytest.approx(1e-9 * k)
    assert ph["update"] == pytest.approx(2e-5 + 1e-10 * 4 * k) and ph["fixed"] == 1e-3
    assert adv.step_time("topk", s, link(1e9))["overhead"] == pytest.approx(sum(v for p, v in ph.items()
                                                                                 if p != "exchange"))
    assert "fixed" not in adv.scheme_phases("cltk", s, link(1e9))


def test_peers_bytes_follow_their_formulas():
    from mpisparse.schemes.oktopk import oktopk_bound_bytes

    s = setting(world=4, hosts=4)
    k = int(0.01 * N)
    ok = adv.peer_phases("oktopk", s, cm.Link(latency=0.0, bandwidth=1.0))
    # (index, value) pairs of 8 bytes: k(W-1)/W of them out in the split, as many in the gather; two thirds of
    # the paper's bound of 6k(W-1)/W 4-byte elements (what the scheme measured: 0.67-0.70 of it, schemes.md)
    # (plus the probes' counts: 128 int64 a rank, gathered)
    assert ok["exchange"] - 8 * 128 * 3 == pytest.approx(2 * 8 * k * 3 / 4) == pytest.approx(
        2 / 3 * oktopk_bound_bytes(k, 4, 4))
    lsgd = adv.peer_phases("localsgd", setting(world=4, hosts=4, local_steps=8), cm.Link(latency=0.0, bandwidth=1.0))
    assert lsgd["exchange"] == pytest.approx(2 * 3 / 4 * N * 4 / 8)  # float32 parameters' ring Allreduce, 1 step in 8
    ps = adv.peer_phases("powersgd", s, cm.Link(latency=0.0, bandwidth=1.0))
    assert ps["exchange"] == pytest.approx(2 * 3 / 4 * (N // 50) * 4)
    with pytest.raises(ValueError, match="not a peer scheme"):
        adv.peer_phases("dense", s, link(1e9))


def test_winner_flips_at_the_crossover():
    s = setting(compute=0.5)
    c = adv.crossover_bandwidth(s, LAT)
    assert c is not None and 1e6 < c < 1e12
    below, above = adv.advise(s, cm.Link(LAT, c / 1.05)), adv.advise(s, cm.Link(LAT, c * 1.05))
    assert below["winner"] not in (adv.BASELINE, "dense") and above["winner"] == adv.BASELINE
    assert below["crossover_bandwidth"] == pytest.approx(c)
    assert below["steps_assumed"] is True


def test_the_crossover_counts_float32_dense_where_it_is_the_faster_dense():
    """Over shared memory a 16-bit wire's casts can cost more than its halved bytes save: dense training
    still wins above the crossover, as float32 dense, and the crossover says so."""
    s = setting(compute=0.5, overheads={adv.BASELINE: 0.3, "dense": 0.0, "topk": 0.05, "cltk": 0.05,
                                        "deft": 0.05, "gtopk": 0.05, "powersgd": 0.05, "oktopk": 0.05})
    c = adv.crossover_bandwidth(s, LAT)
    assert c is not None and 1e6 < c < 1e12
    assert adv.advise(s, cm.Link(LAT, c * 1.05))["winner"] == "dense"
    assert adv.advise(s, cm.Link(LAT, c / 1.05))["winner"] not in (adv.BASELINE, "dense")


def test_more_steps_to_target_lower_the_crossover():
    equal = adv.crossover_bandwidth(setting(), LAT)
    steps = {adv.BASELINE: 100.0, "dense": 100.0, **{x: 130.0 for x in adv.ADVISE_SCHEMES[2:]}}
    slower = adv.crossover_bandwidth(setting(steps=steps), LAT)
    assert slower < equal / 2
    res = adv.advise(setting(steps=steps), link(1e12))
    rows = {r["scheme"]: r for r in res["rows"]}
    assert rows["topk"]["time_to_target"] == pytest.approx(130 * rows["topk"]["step_seconds"])
    assert res["winner"] == adv.BASELINE and res["steps_assumed"] is False


def test_no_sparse_scheme_reaching_the_target_means_dense_wins_everywhere():
    steps = {adv.BASELINE: 100.0, **{x: None for x in adv.ADVISE_SCHEMES[1:]}}
    s = setting(steps=steps)
    assert adv.advise(s, link(1e6))["winner"] == adv.BASELINE
    assert adv.crossover_bandwidth(s, LAT) == 1e4  # the lowest bandwidth of the range


def test_load_tta_maps_the_optimized_dense_row(tmp_path):
    p = tmp_path / "tta.json"
    p.write_text(json.dumps({"rows": [
        {"scheme": "dense", "wire_dtype": "float16", "overlap": True, "steps_to_target": 120},
        {"scheme": "dense", "wire_dtype": "float32", "steps_to_target": 118},
        {"scheme": "topk", "steps_to_target": "not reached"}, {"scheme": "deft", "steps_to_target": 150}]}))
    assert am.load_tta(str(p)) == {adv.BASELINE: 120.0, "dense": 118.0, "topk": None, "deft": 150.0}
    p.write_text(json.dumps([{"scheme": "topk", "steps_to_target": 3}]))
    with pytest.raises(ValueError, match="no dense row"):
        am.load_tta(str(p))


def test_validation_compares_steps_and_winners():
    res = adv.advise(setting(), link(1e9))
    measured = {"rows": [{"scheme": r["scheme"], "step_seconds": r["step_seconds"] * 1.1} for r in res["rows"]]}
    measured["rows"].append({"scheme": "dense-16", "step_seconds": 0.01})  # measured only, not a contender
    v = am.validate(res, measured)
    assert v["winner_agrees"] and v["max_abs_error"] == pytest.approx(1 / 11)
    assert v["kind_agrees"] and v["predicted_kind"] == am.kind(res["winner"])
    assert [am.kind(x) for x in (adv.BASELINE, "dense", "cltk", None)] == [adv.BASELINE, "dense", "sparse", None]
    assert "agree" in am.format_validation(v)


@pytest.mark.mpi  # the JSON's provenance asks mpi4py for the MPI library's version
def test_cli_prints_the_winner_and_crossover(tmp_path):
    j = tmp_path / "a.json"
    r = CliRunner().invoke(cli, ["advise", "--compute-seconds", "0.5", "--rate", "30mbit", "--json", str(j)])
    assert r.exit_code == 0, r.output
    assert "winner:" in r.output and "crossover: dense (dense-opt or float32, the faster) wins above" in r.output
    assert "assumed to need as many steps as dense" in r.output
    res = json.loads(j.read_text())
    assert res["bandwidth"] == pytest.approx(30e6 / 8) and res["winner"] not in (adv.BASELINE, "dense")
    assert {r["scheme"] for r in res["rows"]} == set(adv.ADVISE_SCHEMES) - {"localsgd"}  # no steps measured


@pytest.mark.parametrize("args, message", [
    (["--rate", "1gbt"], "link rate '1gbt'"),
    (["--rate", "0mbit"], "link rate '0mbit'; it must be > 0"),
    (["--hidden-share", "1.5"], "Invalid value for '--hidden-share'"),
    (["-W", "3", "--hosts", "2"], "W = 3 on 2 hosts"),
    (["-W", "8", "--ranks-per-host", "3"], "W = 8 with --ranks-per-host 3; W must be a multiple"),
    (["-W", "8", "--ranks-per-host", "4", "--hosts", "4"], "make 16 ranks, not W = 8; give one of them"),
    (["-W", "8", "--ranks-per-host", "0"], "Invalid value for '--ranks-per-host'"),
    (["-W", "4", "--ranks-per-host", "2", "--intra-rate", "0gbit"], "link rate '0gbit'; it must be > 0"),
    (["--dense-exchange", "gloo"], "Invalid value for '--dense-exchange'"),
    (["--device", "tpu"], "Invalid value for '--device'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = CliRunner().invoke(cli, ["advise", "--compute-seconds", "1", *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1


def test_measured_overheads_replace_the_kernel_rates(tmp_path):
    p = tmp_path / "w1.json"
    p.write_text(json.dumps({"world_size": 1, "compute_seconds": 2.0, "rows": [
        {"scheme": "compute", "step_seconds": 2.0}, {"scheme": "dense-opt", "step_seconds": 2.2},
        {"scheme": "topk", "step_seconds": 2.5}, {"scheme": "deft", "step_seconds": 1.9}]}))
    over = am.overheads_from(str(p))
    assert over == pytest.approx({"dense-opt": 0.1, "topk": 0.25, "deft": 0.0})
    s = setting(compute=4.0, overheads=over)
    assert adv.step_time("topk", s, link(1e9))["overhead"] == pytest.approx(1.0)  # a share of this compute
    assert adv.step_time("cltk", s, link(1e9))["overhead"] < 0.1  # not measured: the kernel rates
    p.write_text(json.dumps({"world_size": 2, "compute_seconds": 2.0, "rows": [{"scheme": "compute"}]}))
    with pytest.raises(ValueError, match="one rank alone"):
        am.overheads_from(str(p))


def test_delivered_bandwidth_is_what_dense_exchange_carried(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps([{"scheme": "dense", "exchange_seconds": 0.2, "bytes_sent_per_rank": 4.0e7}]))
    assert am.delivered_bandwidth(str(p)) == pytest.approx(2.0e8)
    p.write_text(json.dumps([{"scheme": "topk", "exchange_seconds": 0.2, "bytes_sent_per_rank": 1.0}]))
    with pytest.raises(ValueError, match="no dense row"):
        am.delivered_bandwidth(str(p))


def test_a_mismatch_says_how_far_and_whether_it_is_within_the_noise():
    from mpisparse.bench.advise_steps import step_samples

    assert step_samples([[1.0, 3.0, 2.0], [2.0, 1.0, 2.5]]) == [2.0, 3.0, 2.5]  # each step's slowest rank
    with pytest.raises(ValueError, match="every rank times as many"):
        step_samples([[1.0], [1.0, 2.0]])
    res = adv.advise(setting(), link(1e9))
    pred = res["winner"]
    load = [1.0, 3.0, 1.5, 2.0]  # the machine's load changes from turn to turn, alike for every way
    rows = [{"scheme": "compute", "step_seconds": 1.75, "step_samples_seconds": [1.0 * x for x in load]}]
    for r in res["rows"]:
        rows.append({"scheme": r["scheme"], "step_samples_seconds": [(1.3 if r["scheme"] == pred else 1.6) * x
                                                                     for x in load]})
    other = next(r for r in rows[1:] if r["scheme"] != pred)
    for r in rows:
        r["step_seconds"] = sorted(r["step_samples_seconds"])[2]  # a plain median: the load's, mostly
    paired = am.paired_steps({"rows": rows})
    assert paired["compute"] == pytest.approx(1.75) and paired[pred] == pytest.approx(1.75 + 0.3 * 1.75)
    v = am.validate(res, {"rows": rows})
    assert v["winner_agrees"] and v["gap"] == 0.0 and v["paired"]
    other["step_samples_seconds"] = [1.2, 3.95, 1.8, 2.5]  # faster in the paired median, slower in one turn
    v = am.validate(res, {"rows": rows})
    assert not v["winner_agrees"] and v["measured_winner"] == other["scheme"] and v["gap"] > 0
    assert (v["slower_turns"], v["turns"], v["within_noise"]) == (3, 4, True)
    assert "slower in 3 of 4 turns, sign test p = 0.31: within the noise" in am.format_validation(v)
    assert set(v["tied"]) == set(adv.ADVISE_SCHEMES) - {"localsgd"}  # the rest were slower in every turn, but 4 turns cannot say
    other["step_samples_seconds"] = [1.1, 3.2, 1.6, 2.1]  # faster in every turn: 4 of 4 is p = 1/16, still noise
    v = am.validate(res, {"rows": rows})
    assert (v["slower_turns"], v["within_noise"]) == (4, True)
    for r in rows:  # eight turns, faster in every one: p = 1/256, beyond the noise
        r["step_samples_seconds"] = r["step_samples_seconds"] * 2
    v = am.validate(res, {"rows": rows})
    assert (v["slower_turns"], v["turns"], v["within_noise"]) == (8, 8, False)
    assert "beyond the noise" in am.format_validation(v) and v["tied"] == [other["scheme"]]
    for r in rows:  # an older measurement without per-step times: plain medians, no noise verdict
        del r["step_samples_seconds"]
    v = am.validate(res, {"rows": rows})
    assert not v["paired"] and v["within_noise"] is None and v["tied"] is None
    assert v["rows"][0]["measured_seconds"] == v["rows"][0]["measured_median_seconds"]


def test_the_hidden_share_and_the_overheads_are_paired_by_turn(tmp_path):
    load = [1.0, 2.0, 4.0]
    rows = [{"scheme": k, "step_seconds": 0.0, "step_samples_seconds": [f * x for x in load]}
            for k, f in (("compute", 1.0), ("dense-16", 1.5), (adv.BASELINE, 1.3), ("cltk", 1.1))]
    m = {"rows": rows, "hidden_share": 0.9, "world_size": 1, "compute_seconds": 2.0}
    assert am.hidden_share_from(m) == pytest.approx(0.4)  # (1.5 - 1.3) / (1.5 - 1)
    p = tmp_path / "o.json"
    p.write_text(json.dumps(m))
    assert am.overheads_from(str(p)) == pytest.approx({adv.BASELINE: 0.3, "cltk": 0.1})
    for r in rows:
        del r["step_samples_seconds"]
    assert am.hidden_share_from(m) == 0.9


def test_measured_bytes_scale_the_exchange_bandwidth_term_only(tmp_path):
    s = setting(world=4, hosts=4)
    k = int(0.01 * N)
    from mpisparse.schemes.oktopk import oktopk_bound_bytes

    assert adv.model_bytes("oktopk", s) == pytest.approx(2 / 3 * oktopk_bound_bytes(k, 4, 4) + 8 * 128 * 3)
    assert adv.model_bytes("dense", s) == pytest.approx(2 * 3 / 4 * N * 4)
    p = tmp_path / "steps.json"
    p.write_text(json.dumps({"world_size": 4, "rows": [
        {"scheme": "compute", "bytes_per_step": 0}, {"scheme": "dense", "bytes_per_step": 2 * 3 / 4 * N * 4},
        {"scheme": "oktopk", "bytes_per_step": 3 * adv.model_bytes("oktopk", s)}, {"scheme": "dense-16"}]}))
    got = am.bytes_from(str(p), 4)
    assert set(got) == {"dense", "oktopk"}  # compute sends nothing; dense-16 is not a contender
    measured = setting(world=4, hosts=4, bytes_sent=got)
    lk = link(100e6)
    latency = adv.step_time("oktopk", s, cm.Link(latency=LAT, bandwidth=float("inf")))["exchange"]
    assert latency > 0
    plain, scaled = (adv.step_time("oktopk", x, lk)["exchange"] for x in (s, measured))
    assert scaled - latency == pytest.approx(3 * (plain - latency))  # three times the bytes, the same rounds
    assert adv.step_time("dense", measured, lk)["exchange"] == pytest.approx(adv.step_time("dense", s, lk)["exchange"])
    assert adv.step_time("topk", measured, lk) == adv.step_time("topk", s, lk)  # not measured: the byte model
    with pytest.raises(ValueError, match="W = 4; the bytes must come from a run on the W = 2"):
        am.bytes_from(str(p), 2)
    r = CliRunner().invoke(cli, ["advise", "--compute-seconds", "1", "-W", "2", "--bytes-from", str(p)])
    assert r.exit_code == 2 and "the bytes must come from a run on the W = 2" in r.output, r.output


def test_a_token_bucket_lets_a_steps_first_bytes_through():
    from mpisparse.bench.costmodel import parse_size

    assert parse_size("128kb") == parse_size("128k") == 128 * 1024 and parse_size("1mb") == 1024 ** 2
    assert parse_size("1500") == parse_size("1500b") == 1500 and parse_size("0") == 0
    for bad in ("12kbit", "x", "-1kb", "inf"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    n = 57_000  # a small net: 228 kB of float32 dense at W = 2, 114 kB at 16 bits
    lk = cm.Link(latency=0.0, bandwidth=30e6 / 8)
    plain = setting(n=n, compute=0.05, powersgd_elements=None)
    bucket = setting(n=n, compute=0.05, powersgd_elements=None, burst=128 * 1024)
    full = adv.step_time("dense", plain, lk)["exchange"]
    assert full == pytest.approx(n * 4 / lk.bandwidth)
    # the bucket (refilled during 50 ms of compute: 187 kB > 128 kB) takes its 128 kB off float32 dense's ...
    assert adv.step_time("dense", bucket, lk)["exchange"] == pytest.approx((n * 4 - 128 * 1024) / lk.bandwidth)
    # ... and all of the 16-bit baseline's 114 kB
    assert adv.step_time(adv.BASELINE, bucket, lk)["exchange"] == pytest.approx(0.0, abs=1e-12)
    # a short compute refills less of it: 10 ms at 3.75 MB/s = 37.5 kB
    short = setting(n=n, compute=0.01, powersgd_elements=None, burst=128 * 1024)
    assert adv.step_time("dense", short, lk)["exchange"] == pytest.approx((n * 4 - 0.01 * lk.bandwidth) / lk.bandwidth)
    r = CliRunner().invoke(cli, ["advise", "--compute-seconds", "1", "--burst", "12kbit"])
    assert r.exit_code == 2 and "size '12kbit'" in r.output, r.output
    with pytest.raises(ValueError, match="burst -1"):
        setting(burst=-1.0)


def test_the_sign_test():
    assert am.sign_test_p(0, 5) == 1.0 and am.sign_test_p(4, 4) == 1 / 16
    assert am.sign_test_p(15, 20) == pytest.approx(0.0207, abs=1e-4)
    assert am.sign_test_p(15, 20) < am.NOISE_LEVEL < am.sign_test_p(14, 20)
    assert am.sign_test_p(7, 8) == pytest.approx(9 / 256)


def test_the_median_interval_is_distribution_free():
    assert adv.median_interval(range(6)) == (0, 5)  # 1 - 2/64 = 96.9% >= 95%
    assert adv.median_interval(range(5)) is None  # 1 - 2/32 = 93.8%: five turns cannot bound it
    assert adv.median_interval(range(20)) == (5, 14)  # P[B(20, 1/2) <= 5] = 0.021 <= 0.025 < P[.. <= 6]
    assert adv.median_interval(list(range(40))[::-1]) == (13, 26)  # sorted first


def test_ties_are_the_schemes_the_measured_overheads_cannot_separate_from_the_winner(tmp_path):
    lk = cm.Link(latency=0.0, bandwidth=float("inf"))  # no exchange cost: the overheads decide
    base = [0.10 + 0.01 * (i % 5) for i in range(20)]  # the winner's overhead share, turn by turn
    turns = {"gtopk": base,
             "deft": [x + 0.002 + (0.03 if i % 2 else -0.02) for i, x in enumerate(base)],  # noisy, a little slower
             "cltk": [x + 0.05 for x in base],  # slower in every turn
             "topk": [x + 0.001 for x in base[:5]]}  # another run's turns: not paired with the winner's
    over = {k: max(0.0, sorted(v)[len(v) // 2]) for k, v in turns.items()}
    over.update({"oktopk": 0.5, "powersgd": 0.5, "dense": 0.5, adv.BASELINE: 0.5})  # far behind
    s = setting(overheads=over, overhead_turns=turns)
    res = adv.advise(s, lk)
    assert res["winner"] == "gtopk" and res["ties"] == ["deft", "gtopk"]  # the rows' order
    assert "(tied at the measured overheads' 95% interval: deft)" in adv.format_advice(res)
    short = setting(overheads=over, overhead_turns={k: v[:5] for k, v in turns.items()})
    assert set(adv.advise(short, lk)["ties"]) >= {"gtopk", "deft", "cltk"}  # five turns cannot bound a median
    assert adv.advise(setting(overheads=over), lk)["ties"] == ["gtopk"]  # no turns: no ties beyond equal steps
    # the validation: the measured winner among the ties and the predicted winner within the noise agree at the
    # resolution of both; a measured winner outside the ties does not
    rows = [{"scheme": "compute", "step_samples_seconds": [1.0] * 8}]
    for r in res["rows"]:
        f = {"deft": 1.10, "gtopk": 1.11, "cltk": 1.2}.get(r["scheme"], 1.6)
        rows.append({"scheme": r["scheme"], "step_samples_seconds": [f + (0.02 if i % 2 else -0.02) * (r["scheme"]
                                                                     == "gtopk") for i in range(8)]})
    for r in rows:
        r["step_seconds"] = sorted(r["step_samples_seconds"])[4]
    v = am.validate(res, {"rows": rows})
    assert v["measured_winner"] == "deft" and not v["winner_agrees"] and v["within_noise"]
    assert v["measured_in_ties"] and v["agrees_at_resolution"] and v["predicted_ties"] == ["deft", "gtopk"]
    assert "agree at resolution" in am.format_validation(v)
    next(r for r in rows if r["scheme"] == "cltk")["step_samples_seconds"] = [1.0] * 8
    v = am.validate(res, {"rows": rows})
    assert v["measured_winner"] == "cltk" and not v["measured_in_ties"] and not v["agrees_at_resolution"]
    assert "DIFFER" in am.format_validation(v)


@pytest.mark.parametrize("content", ["[1, 2]", "{\"rows\": [{\"scheme\": \"topk\"}]}", "not json"])
@pytest.mark.parametrize("option", ["--measured", "--overhead-from", "--bytes-from", "--hidden-from"])
def test_a_file_that_is_not_advise_steps_output_is_a_usage_error(tmp_path, option, content):
    p = tmp_path / "other.json"
    p.write_text(content)
    r = CliRunner().invoke(cli, ["advise", "--compute-seconds", "1", option, str(p)])
    assert r.exit_code == 2, r.output
    assert f"{p}: not " in r.output and len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1


def _row(output: str, scheme: str) -> list[str]:
    return next(ln.split() for ln in output.splitlines() if ln.split()[:1] == [scheme])


def test_advice_for_nodes_of_eight_gpus_names_its_rates_and_exchange_models():
    args = ["advise", "--model", "resnet50", "-W", "128", "--ranks-per-host", "8", "--rate", "25gbit",
            "--compute-seconds", "0.2"]
    gpu = CliRunner().invoke(cli, [*args, "--device", "cuda"])
    assert gpu.exit_code == 0, gpu.output
    assert "W=128 on 16 hosts (8 a host), NIC 25 Gbit/s, intra-host 3,600 Gbit/s" in gpu.output
    assert "rate table NVIDIA H200 (mpisparse/bench/rate_tables/nvidia-h200.json), with its fixed cost per step" \
        in gpu.output
    assert "exchange models: nccl: dense-opt, dense; flat: topk, cltk, deft, gtopk, powersgd, oktopk" in gpu.output
    assert "crossover: dense (dense-opt or float32, the faster) wins above" in gpu.output
    cpu = CliRunner().invoke(cli, [*args, "--device", "cpu"])
    assert cpu.exit_code == 0, cpu.output
    assert "rate table AMD EPYC, 2 cores" in cpu.output and "exchange models: flat: dense-opt, dense, topk" in cpu.output
    # topk's own compute: the CPU's scatter of W k entries against the GPU's (scheme compute ms, column 5)
    assert float(_row(cpu.output, "topk")[4].replace(",", "")) > 50 * float(_row(gpu.output, "topk")[4])
    two = CliRunner().invoke(cli, [*args, "--device", "cuda", "--hierarchical", "--dense-exchange", "mpi"])
    assert "two-level: dense, topk, cltk, deft, powersgd" in two.output, two.output
    # a GPU's compute step is not measured here
    r = CliRunner().invoke(cli, args[:-2] + ["--device", "cuda"])
    assert r.exit_code == 2 and "give --compute-seconds" in r.output, r.output


def test_a_users_rate_table_measured_here_and_read_back(tmp_path):
    p = tmp_path / "mine.json"
    r = CliRunner().invoke(cli, ["advise", "--model", "cnn", "--compute-seconds", "0.05", "--measure-rates", str(p)])
    assert r.exit_code == 0, r.output
    assert "rate table CPU" in r.output and f"({p})" in r.output
    r2 = CliRunner().invoke(cli, ["advise", "--model", "cnn", "--compute-seconds", "0.05", "--rates", str(p)])
    assert r2.exit_code == 0 and _row(r2.output, "topk") == _row(r.output, "topk"), r2.output
    p.write_text(json.dumps({"format": "something else"}))
    r3 = CliRunner().invoke(cli, ["advise", "--compute-seconds", "0.05", "--rates", str(p)])
    assert r3.exit_code == 2 and f"{p}: not a rate table" in r3.output, r3.output
    assert len([ln for ln in r3.output.splitlines() if ln.startswith("Error")]) == 1


def test_a_measurement_of_another_setting_is_refused(tmp_path):
    p = tmp_path / "steps.json"
    p.write_text(json.dumps({"world_size": 4, "hierarchical": True, "compute_seconds": 1.0,
                             "rows": [{"scheme": "compute", "step_seconds": 1.0}]}))
    base = ["advise", "--compute-seconds", "1", "--measured", str(p)]
    r = CliRunner().invoke(cli, [*base, "-W", "4", "--ranks-per-host", "2"])
    assert r.exit_code == 2 and "ran two-level (--hierarchical) collectives" in r.output, r.output
    r = CliRunner().invoke(cli, [*base, "-W", "2"])
    assert r.exit_code == 2 and "--measured ran on W = 4; the advice is for W = 2" in r.output, r.output


def test_localsgd_is_predicted_only_from_measured_steps():
    """A local-update scheme's step is cheap by construction (its Allreduce every H steps); its price is in the
    steps it needs, so the advisor predicts it only with measured steps to target (--tta)."""
    plain = setting(world=4, hosts=4, local_steps=8)
    assert "localsgd" not in {r["scheme"] for r in adv.advise(plain, link(1e9))["rows"]}
    steps = {adv.BASELINE: 100.0, "dense": 100.0, "localsgd": 160.0}
    res = adv.advise(setting(world=4, hosts=4, local_steps=8, steps=steps), link(1e9))
    row = next(r for r in res["rows"] if r["scheme"] == "localsgd")
    assert row["time_to_target"] == pytest.approx(160.0 * row["step_seconds"])
    every = adv.step_time("localsgd", setting(world=4, hosts=4, local_steps=1), link(1e9))["exchange"]
    assert row["exchange_seconds"] == pytest.approx(every / 8)  # the period's Allreduce, an eighth a step
    with pytest.raises(ValueError, match="local steps 0; it must be >= 1"):
        setting(local_steps=0)
