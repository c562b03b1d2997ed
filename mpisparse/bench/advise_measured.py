"""What ``mpisparse advise`` reads from measurements, and its validation against measured steps.

The inputs (each a ValueError naming the file when it is not what it should be): the steps to target of a
``bench tta --json`` (:func:`load_tta`), the link's bandwidth as dense's exchange carried it
(:func:`delivered_bandwidth`), and from ``advise-steps --json`` (:func:`load_steps`) the share overlap hid
(:func:`hidden_share_from`), each scheme's step overhead on one rank (:func:`overheads_from`, and turn by turn
for the ties, :func:`overhead_turns_from`) and its bytes per step (:func:`bytes_from`).  Every measured step is
read *paired by turn* with the compute way's (:func:`paired_steps`).  :func:`validate` compares an advice
(:func:`mpisparse.bench.advise.advise`) with measured steps: errors, the winners, the sign test over the turns
(:func:`sign_test_p`) and the agreement at the resolution of both sides.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from .advise import ADVISE_SCHEMES, BASELINE


def load_tta(path: str) -> dict[str, float | None]:
    """Steps to target per advisor label from a ``bench tta --json`` file (a list of rows, or an object with
    ``rows`` or ``schemes``).  A dense row with a 16-bit wire or overlap is the baseline (``dense-opt``);
    ``steps_to_target`` None or a string ("not reached"): None."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        rows = data.get("rows") or data.get("schemes") or data.get("results")
        if isinstance(rows, dict):
            rows = [{"scheme": k, **v} for k, v in rows.items()]
    else:
        rows = data
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: no per-scheme rows (a list, or an object with 'rows')")
    out: dict[str, float | None] = {}
    for r in rows:
        if not isinstance(r, dict) or "scheme" not in r or "steps_to_target" not in r:
            raise ValueError(f"{path}: a row without 'scheme' and 'steps_to_target': {r!r}"[:200])
        label = str(r.get("label") or r["scheme"])
        if label == "dense" and (r.get("overlap") or str(r.get("wire_dtype", "float32")) != "float32"):
            label = BASELINE
        v = r["steps_to_target"]
        out[label] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if BASELINE not in out and "dense" not in out:
        raise ValueError(f"{path}: no dense row; the steps of the other schemes are relative to dense's")
    return out


def _median(v: Sequence[float]) -> float:
    import statistics

    return statistics.median(v)


def _samples(measured: dict[str, Any]) -> dict[str, list[float]] | None:
    """Every way's timed steps (the slowest rank's, in step order) of an ``advise-steps`` result; None when a row
    lacks them (an older file) or the compute way is missing or the counts differ."""
    got = {r["scheme"]: r.get("step_samples_seconds") for r in measured["rows"]}
    if "compute" not in got or any(not v for v in got.values()) or len({len(v) for v in got.values()}) != 1:
        return None
    return {k: [float(x) for x in v] for k, v in got.items()}


def paired_steps(measured: dict[str, Any]) -> dict[str, float]:
    """Each way's measured step, paired with the compute way's step of the same turn: the compute way's median
    plus the median over the timed steps of ``way[i] - compute[i]``.  The ways take turns step by step, so a
    change of the machine's load (other jobs) falls on a turn's ways alike and cancels in the difference; the
    plain median of each way's steps keeps it.  Without per-step times: each row's ``step_seconds``."""
    sm = _samples(measured)
    if sm is None:
        return {r["scheme"]: float(r["step_seconds"]) for r in measured["rows"]}
    c = sm["compute"]
    base = _median(c)
    return {k: base + _median([x - y for x, y in zip(v, c)]) for k, v in sm.items()}


def hidden_share_from(measured: dict[str, Any]) -> float:
    """The share of the 16-bit exchange overlap hid, from an ``advise-steps`` result: paired by turn (as
    :func:`paired_steps`), ``median(dense-16[i] - dense-opt[i]) / median(dense-16[i] - compute[i])`` in [0, 1];
    without per-step times its ``hidden_share``."""
    sm = _samples(measured)
    if sm is None or not {"dense-16", BASELINE} <= set(sm):
        return float(measured["hidden_share"])
    d16, opt, c = sm["dense-16"], sm[BASELINE], sm["compute"]
    exchange = _median([x - y for x, y in zip(d16, c)])
    if not exchange > 0:
        return 0.0
    return min(1.0, max(0.0, _median([x - y for x, y in zip(d16, opt)]) / exchange))


def validate(res: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Predicted against measured (an ``advise-steps`` result): each scheme's step and its error, and the
    winner of each (the least step times steps to target; the measured ``dense-16`` way, which only serves
    to measure the hidden share, is not a contender).  The measured step is paired by turn with the compute
    way (:func:`paired_steps`; the plain median is kept as ``measured_median_seconds``).

    A strict comparison names one measured winner even where the ways lie within the noise, so the result
    also says how far the predicted winner's measured time is from the measured best (``gap``: a share of
    the best), in how many of the timed turns the predicted winner was the slower of the two
    (``slower_turns`` of ``turns``), and whether the gap lies within the noise (``within_noise``: a one-sided
    sign test over the turns, :func:`sign_test_p`, does not find it slower at the 5% level; None when the
    measurement holds no per-step times).  ``tied``: every measured way that the same test does not find
    slower than the measured best (the ways the measurement cannot tell from the winner).

    At the resolution of both sides (``agrees_at_resolution``): the winners agree, or the measured winner is among
    the advice's ties (``measured_in_ties``: the predicted winner's measured overheads cannot separate it from
    the measured winner, :func:`ties`) and the predicted winner is within the measurement's noise of the
    measured best."""
    paired = paired_steps(measured)
    sm = _samples(measured)
    rows = []
    for r in res["rows"]:
        m = next((x for x in measured["rows"] if x["scheme"] == r["scheme"]), None)
        if m is None:
            continue
        steps, t = r["steps_to_target"], paired[r["scheme"]]
        spread = None
        if sm is not None:
            d = [x - y for x, y in zip(sm[r["scheme"]], sm["compute"])]
            spread = (min(d), max(d))
        rows.append({"scheme": r["scheme"], "predicted_seconds": r["step_seconds"], "measured_seconds": t,
                     "measured_median_seconds": float(m["step_seconds"]),
                     "over_compute_min_seconds": None if spread is None else spread[0],
                     "over_compute_max_seconds": None if spread is None else spread[1],
                     "error": (r["step_seconds"] - t) / t if t else None,
                     "measured_time_to_target": None if steps is None else t * steps,
                     "steps_to_target": steps})
    reached = [r for r in rows if r["measured_time_to_target"] is not None]
    winner = min(reached, key=lambda r: r["measured_time_to_target"])["scheme"] if reached else None
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    by = {r["scheme"]: r for r in rows}
    gap = within = slower = turns = None
    if winner is not None and res["winner"] in by and by[res["winner"]]["measured_time_to_target"] is not None:
        best, pred = by[winner], by[res["winner"]]
        gap = pred["measured_time_to_target"] / best["measured_time_to_target"] - 1
        if sm is not None:
            sp, sb = pred["steps_to_target"] or 1.0, best["steps_to_target"] or 1.0
            turns = len(sm["compute"])
            slower = sum(1 for x, y in zip(sm[pred["scheme"]], sm[best["scheme"]]) if x * sp > y * sb)
            within = winner == res["winner"] or sign_test_p(slower, turns) >= NOISE_LEVEL
    tied = None
    if sm is not None and winner is not None:
        best = by[winner]
        sb = best["steps_to_target"] or 1.0
        tied = [r["scheme"] for r in reached
                if r["scheme"] == winner or sign_test_p(
                    sum(1 for x, y in zip(sm[r["scheme"]], sm[winner]) if x * (r["steps_to_target"] or 1.0) > y * sb),
                    len(sm["compute"])) >= NOISE_LEVEL]
    predicted_ties = res.get("ties") or [res["winner"]]
    in_ties = winner in predicted_ties
    return {"rows": rows, "predicted_winner": res["winner"], "measured_winner": winner, "tied": tied,
            "predicted_ties": predicted_ties, "measured_in_ties": in_ties,
            "agrees_at_resolution": winner == res["winner"] or (in_ties and bool(within)),
            "winner_agrees": winner == res["winner"], "max_abs_error": max(errors, default=None),
            "predicted_kind": kind(res["winner"]), "measured_kind": kind(winner),
            "kind_agrees": kind(winner) == kind(res["winner"]), "gap": gap, "slower_turns": slower,
            "turns": turns, "within_noise": within, "paired": sm is not None}


#: the level of the sign test below which a way is slower than the measured best beyond the noise
NOISE_LEVEL = 0.05


def sign_test_p(slower: int, turns: int) -> float:
    """One-sided sign test: the chance of at least ``slower`` of ``turns`` paired turns going one way when
    either way is as likely (``P[Binomial(turns, 1/2) >= slower]``).  With 4 turns even 4 of 4 gives 0.0625:
    so few turns cannot show a difference at the 5% level."""
    return sum(math.comb(turns, i) for i in range(slower, turns + 1)) / 2 ** turns if turns else 1.0


def kind(label: str | None) -> str | None:
    """The decision a winner stands for: ``dense-opt``, float32 ``dense``, or ``sparse`` (any other scheme)."""
    return None if label is None else label if label in (BASELINE, "dense") else "sparse"


def format_validation(v: dict[str, Any]) -> str:
    from ..results.tables import Column, format_rows

    ms = lambda x: f"{1e3 * x:,.1f}"  # noqa: E731
    cols = [Column("scheme", "scheme", "{}", "<"), Column("predicted_seconds", "predicted ms", ms),
            Column("measured_seconds", "measured ms", ms),
            Column("measured_median_seconds", "median ms", ms),
            Column("over_compute_min_seconds", "over compute, least", lambda x: "-" if x is None else ms(x)),
            Column("over_compute_max_seconds", "most", lambda x: "-" if x is None else ms(x)),
            Column("error", "error", lambda e: f"{100 * e:+.0f}%")]
    return (format_rows(v["rows"], cols, title="validation against the measured steps") +
            f"\npredicted winner {v['predicted_winner']}, measured winner {v['measured_winner']}"
            f" ({'agree' if v['winner_agrees'] else 'agree at resolution' if v.get('agrees_at_resolution') else 'DIFFER'};"
            f" {v['predicted_kind']} against {v['measured_kind']}); "
            f"largest error {100 * v['max_abs_error']:.0f}%" + _gap_line(v))


def _gap_line(v: dict[str, Any]) -> str:
    if v.get("gap") is None or v["winner_agrees"]:
        return ""
    if v.get("within_noise") is None:
        noise = "no per-step times"
    else:
        noise = (f"slower in {v['slower_turns']} of {v['turns']} turns, sign test "
                 f"p = {sign_test_p(v['slower_turns'], v['turns']):.2g}: "
                 + ("within the noise" if v["within_noise"] else "beyond the noise"))
    tied = v.get("tied")
    return (f"\nthe predicted winner's measured step is {100 * v['gap']:.1f}% above the measured best ({noise})"
            + (f"\nmeasured ways the sign test cannot tell from the best: {', '.join(tied)}" if tied else ""))


def delivered_bandwidth(path: str) -> float:
    """Bytes per second a link really carried: a ``bench exchange --json`` file's dense row (the ring Allreduce
    sends ``bytes_sent_per_rank`` each way over each host's link in ``exchange_seconds``; the cost model's
    ``2 (W-1)/W m b`` is that divided by the bandwidth).  On the emulated cluster a fast link's nominal
    rate is not what it carries (every host shares this machine's cores)."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in (data if isinstance(data, list) else [data])
            if isinstance(r, dict) and r.get("scheme") == "dense" and r.get("exchange_seconds")
            and r.get("bytes_sent_per_rank")]
    if not rows:
        raise ValueError(f"{path}: no dense row with exchange_seconds and bytes_sent_per_rank (bench exchange "
                         "--scheme dense --densities 1 --json)")
    return max(float(r["bytes_sent_per_rank"]) / float(r["exchange_seconds"]) for r in rows)


def bytes_from(path: str, world: int) -> dict[str, float]:
    """Bytes one rank sent per step, per label, from an ``advise-steps --json`` file (``bytes_per_step``: the
    largest over the ranks), for :attr:`Setting.bytes_sent`: a run on the ``world`` ranks advised about (the
    bytes change with W)."""
    data = load_steps(path)
    if int(data.get("world_size", 0)) != world:
        raise ValueError(f"{path}: a run on W = {data.get('world_size')}; the bytes must come from a run on "
                         f"the W = {world} ranks advised about")
    return {r["scheme"]: float(r["bytes_per_step"]) for r in data["rows"]
            if r["scheme"] in ADVISE_SCHEMES and r.get("bytes_per_step")}


def overheads_from(path: str) -> dict[str, float]:
    """Each scheme's step overhead as a share of the compute step, from an ``advise-steps -n 1 --json`` file:
    ``(step - compute) / compute`` of one rank alone (no link in the way; negative shares, noise, are 0), the
    step paired by turn with the compute way's (:func:`paired_steps`)."""
    data = load_steps(path)
    if int(data.get("world_size", 0)) != 1:
        raise ValueError(f"{path}: the overheads come from one rank alone (advise-steps -n 1); "
                         f"this run had W = {data.get('world_size')}")
    compute = float(data["compute_seconds"])
    if not compute > 0:
        raise ValueError(f"{path}: compute step {compute} s; it must be > 0")
    paired = paired_steps(data)  # paired by turn with the compute way where the file has per-step times
    compute = paired.get("compute", compute)
    return {r["scheme"]: max(0.0, (paired[r["scheme"]] - compute) / compute)
            for r in data["rows"] if r["scheme"] in ADVISE_SCHEMES}


def overhead_turns_from(path: str) -> dict[str, tuple[float, ...]]:
    """Each scheme's step overhead in every timed turn of an ``advise-steps -n 1 --json`` file, as
    :func:`overheads_from` reads their median: ``(step[i] - compute[i]) / median(compute)``, unclipped (the
    noise, for :func:`ties`); empty when the file holds no per-turn times."""
    data = load_steps(path)
    if int(data.get("world_size", 0)) != 1:
        raise ValueError(f"{path}: the overheads come from one rank alone (advise-steps -n 1); "
                         f"this run had W = {data.get('world_size')}")
    sm = _samples(data)
    if sm is None:
        return {}
    base = _median(sm["compute"])
    return {k: tuple((x - y) / base for x, y in zip(v, sm["compute"])) for k, v in sm.items()
            if k in ADVISE_SCHEMES}


def check_measured_matches(measured: dict[str, Any], *, world: int, hierarchical: bool) -> None:
    """ValueError (one line) when an ``advise-steps`` result to validate against ran another setting than the
    advice: another W, or flat against two-level collectives (a file without the ``hierarchical`` field ran
    flat)."""
    w = measured.get("world_size")
    if w is not None and int(w) != world:
        raise ValueError(f"--measured ran on W = {w}; the advice is for W = {world}")
    ran = bool(measured.get("hierarchical", False))
    if ran != hierarchical:
        raise ValueError(f"--measured ran {'two-level (--hierarchical)' if ran else 'flat'} collectives; the advice "
                         f"models {'two-level' if hierarchical else 'flat'} ones: "
                         + ("add" if ran else "drop") + " --hierarchical")


def load_steps(path: str) -> dict[str, Any]:
    """An ``advise-steps --json`` result; a file that is not one (not JSON, no rows naming their ``scheme``, no
    ``compute`` way) is a ValueError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "scheme" in r for r in rows) \
            or "compute" not in {r["scheme"] for r in rows}:
        raise ValueError(f"{path}: not an `advise-steps --json` result (rows, one per way, the compute way among "
                         "them)")
    return data
