"""The tables of one machine's benchmarks: selection kernels, DEFT's selection against W, step time and memory,
the plain and fused step compute, top-k's build-up on drawn and real gradients, the exchange alone and scaling
with W (``bench select``, ``bench step``, ``bench exchange``, ``bench scaling``).
"""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table, _as_list, _dens, _int, _mb, _ms, _phase, _ratio


def _bench_select_render(res: dict[str, Any], quick: bool) -> str:
    r = res["select"]
    p = r.get("params", {})
    names = {
        "torch_topk": "`torch.topk(x.abs(), k)`",
        "np_argpartition": "`np.argpartition(np.abs(x), n - k)`",
        "topk_abs": "`topk_abs` (exact top-k)",
        "topk_abs_noscratch": "`topk_abs` without a reused scratch buffer",
        "topk_abs_numpy": "`topk_abs`, NumPy candidate pass (`MPISPARSE_FUSED=0`)",
        "abs_pass": "`np.abs(x)`: one pass over the data (allocating)",
        "abs_pass_out": "`np.abs(x, out=buf)`: one pass over the data",
        "threshold_select": "`threshold_select` at the k-th largest magnitude",
        "estimate_threshold": "`estimate_threshold` (sampled)",
    }
    timings = r.get("timings", {})
    order = [k for k in names if k in timings] + sorted(k for k in timings if k not in names)
    rows = [[names.get(k, f"`{k}`"), f"{timings[k]['best_ms']:,.2f}", f"{timings[k]['median_ms']:,.2f}"]
            for k in order]
    ratios = [[f"`{k}`", f"{v:.2f}", f"{r.get('ratios_median', {}).get(k, float('nan')):.2f}"]
              for k, v in r.get("ratios", {}).items()]
    c = r.get("checks", {})
    checks = (f"Checks: top-k exact: {c.get('topk_exact')}; input unmodified: {c.get('x_unmodified')}; "
              f"threshold_select count at the k-th magnitude: {_int(c.get('threshold_select_count'))} "
              f"(k = {_int(p.get('k'))}).")
    return "\n\n".join([
        f"Vector of n = {_int(p.get('n'))} {p.get('dtype', 'float32')} ({p.get('distribution', '')}), "
        f"k = {_int(p.get('k'))} (density {p.get('density')}), best and median of {p.get('repeats')} repeats, "
        f"{p.get('threads', 1)} thread.",
        "### Kernels\n\n" + md_table(["kernel", "best ms", "median ms"], rows),
        "### Ratios\n\n" + md_table(["ratio", "best", "median"], ratios),
        checks])


_table(Table(
    name="select-kernels",
    title="Selection kernels on one vector (`bench select`)",
    about=("The exact top-k and threshold kernels against `torch.topk` and `np.argpartition` and against one "
           "pass over the data (the floor for any selection), on one process with one thread."),
    runs=lambda quick: [Run("select", ["bench", "select", "--size", "1000000" if quick else "25000000",
                                       "--density", "0.001", "--repeats", "2" if quick else "5"])],
    render=_bench_select_render,
))


def _deft_select_render(res: dict[str, Any], quick: bool) -> str:
    rows, checks = [], []
    for label in ("deft-0.001", "deft-0.01"):
        results = _as_list(res.get(label, []))
        for r in results:
            rows.append([r["model"], f"{r['density']:g}", r["world_size"], r.get("layers", r.get("tensors")),
                         _ms(r["topk_seconds"]), _ms(r["deft_max_seconds"]), f"{r['imbalance']:.2f}",
                         _ms(r["overhead_seconds"]), _ratio(r["speedup_measured"]),
                         _ratio(r["speedup_with_overhead"]), _ratio(r["speedup_predicted"])])
        for model in dict.fromkeys(r["model"] for r in results):
            by_w = {r["world_size"]: r for r in results if r["model"] == model}
            w_max = max(by_w)
            one, top = by_w.get(1), by_w[w_max]
            parts = []
            if one:
                ratio = one["deft_max_seconds"] / one["topk_seconds"]
                parts.append(f"W=1 DEFT / top-k {ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'not met'})")
            if w_max > 1:
                sp = top["speedup_measured"]
                parts.append(f"W={w_max} speedup {sp:.2f}x, {sp / w_max:.2f} W (target top-k / 8, i.e. >= 8x: "
                             f"{'met' if sp >= 8 else 'not met'}; >= 0.8 W: {'met' if sp >= 0.8 * w_max else 'not met'})")
            if 8 in by_w:
                im = by_w[8]["imbalance"]
                parts.append(f"imbalance at W=8 {im:.2f} (target <= 1.2: {'met' if im <= 1.2 else 'not met'})")
            checks.append(f"* {model}, density {results[0]['density']:g}: " + "; ".join(parts))
    return md_table(["model", "density", "W", "layers", "top-k ms", "DEFT max ms", "imbalance", "overhead ms",
                     "speedup", "speedup incl. overhead", "eq. 6"], rows, right=range(2, 11)) + (
        "\n\n`top-k ms`: one whole-vector exact top-k. `DEFT max ms`: the slowest rank's layer-wise selection "
        "(DEFT Alg. 5), every rank's share timed one after another in one process, so W may exceed the cores. "
        "`overhead ms`: the work every rank does whatever W is (the per-layer norms, Alg. 3, and the leader's "
        "Alg. 4; in a training step the norms are summed in the compensation pass instead). `imbalance`: "
        "slowest / mean rank. `speedup`: top-k ms / DEFT max ms. `eq. 6`: the paper's predicted speedup "
        "`n log k / max_i sum n_x log k_x`.\n\n### Against the targets of the performance issue\n\n"
        + "\n".join(checks))


def _deft_select_runs(quick: bool) -> list[Run]:
    size = (["--model", "ncf", "--worlds", "1,2", "--repeats", "1"] if quick else
            ["--model", "resnet50", "--model", "lstm-wt2", "--worlds", "1,2,4,8,16", "--repeats", "5"])
    return [Run(f"deft-{d}", ["bench", "select", "--mode", "deft"] + size + ["--density", d])
            for d in ("0.001", "0.01")]


_table(Table(
    name="deft-select",
    title="DEFT: per-rank selection time against W (`bench select --mode deft`)",
    about="DEFT's layer-wise selection per rank against one whole-vector top-k, for growing W.",
    runs=_deft_select_runs,
    render=_deft_select_render,
))


STEP_SCHEMES = ("dense", "topk", "randomk", "threshold", "cltk", "deft", "gtopk", "dgc", "dct")
#: ``bench step --output``'s choices (``mpisparse.config.STEP_OUTPUTS``; this module imports none of the package)
STEP_OUTPUTS = ("own", "gradient")


def _step_memory_render(res: dict[str, Any], quick: bool) -> str:
    by = {(r["scheme"], r.get("config", {}).get("output", "own")): r
          for label in sorted(res) if label.startswith("step-") for r in _as_list(res[label])}
    rows = []
    for s in [s for s in STEP_SCHEMES if any((s, o) in by for o in STEP_OUTPUTS)]:
        own, into = by.get((s, "own")), by.get((s, "gradient"))
        row = [f"`{s}`", _ms(own["step_seconds"]) if own else "—", _ms(into["step_seconds"]) if into else "—",
               _int(own["bytes_sent_per_rank"]) if own else "—", _dens(own["density_actual"]) if own else "—"]
        for r in (own, into):
            rss, buf = (r or {}).get("peak_rss_bytes_per_rank"), (r or {}).get("gradient_buffer_bytes")
            row += [_mb(rss) if rss else "—", _ratio(rss / buf) if rss and buf else "—"]
        rows.append(row)
    r0 = next(iter(by.values()), {})
    return (f"{r0.get('config', {}).get('model')} shapes (n = {_int(r0.get('n'))}), W = {r0.get('world_size')}, "
            f"density {r0.get('density_target')}, {r0.get('config', {}).get('iters')} timed steps; one job per "
            "scheme and output, so the peak resident memory (whole process, interpreter included) is that "
            "scheme's. *own*: the update in the scheme's reused output vector (only the last step's entries "
            "cleared); *gradient*: `--output gradient`, the update written into the gradient buffer, as "
            "`DistributedOptimizer` does (one full buffer less, one zeroing pass more). The target of issue 16 "
            "is at most 4.5x the buffer. The first command only fills numba's cache (a fresh checkout compiles "
            "the loops on first use, which would add to the first measured peaks).\n\n"
            "### Step time and memory\n\n"
            + md_table(["scheme", "step ms (own)", "step ms (gradient)", "bytes/rank/step", "density_actual",
                        "peak RSS MiB (own)", "x buffer (own)", "peak RSS MiB (gradient)", "x buffer (gradient)"],
                       rows))


_table(Table(
    name="step-memory",
    title="Step time and memory of every data-parallel scheme (`bench step`)",
    about=("Whole sparsified steps of every data-parallel scheme on model-shaped synthetic gradients, and each "
           "one's peak resident memory against the gradient buffer, with the update in the scheme's own vector "
           "and written into the gradient."),
    # first, every scheme's loops compiled into numba's cache (a fresh checkout has none: compiling in
    # the measured job would add to its peak), on small shapes, not shown
    runs=lambda quick: [Run("warm-cache", ["bench", "step", "-n", "2", "--model", "ncf", "--density", "0.01",
                                           "--iters", "1", "--warmup", "0"]
                            + [a for s in (STEP_SCHEMES[:2] if quick else STEP_SCHEMES) for a in ("--scheme", s)])]
                       + [Run(f"step-{s}" + ("" if o == "own" else f"-{o}"),
                            ["bench", "step", "-n", "2", "--model", "ncf" if quick else "resnet50",
                             "--scheme", s, "--density", "0.001", "--iters", "2" if quick else "5", "--warmup", "1"]
                            + ([] if o == "own" else ["--output", o]))
                        for s in (STEP_SCHEMES[:2] if quick else STEP_SCHEMES) for o in STEP_OUTPUTS],
    render=_step_memory_render,
))


FUSED_SCHEMES = ("dense", "topk", "cltk", "gtopk", "deft", "dgc", "randomk", "threshold", "dct")
_COMPUTE = ("compensate", "select", "update")


def _fused_step_render(res: dict[str, Any], quick: bool) -> str:
    plain = {r["scheme"]: r for r in _as_list(res.get("plain"))}
    fused = {r["scheme"]: r for r in _as_list(res.get("fused"))}
    rows = []
    for s in FUSED_SCHEMES:
        if s not in plain or s not in fused:
            continue
        cells = [f"`{s}`"]
        for r in (plain[s], fused[s]):
            cells += [_ms(_phase(r, p), 1) for p in _COMPUTE] + [_ms(_compute(r), 1)]
        floor = (fused[s].get("floor") or {}).get("seconds")
        cells += [_ms(floor, 1), "—" if not floor else f"{_compute(fused[s]) / floor:.2f}",
                  _ms(fused[s]["step_seconds"], 1), f"{fused[s]['density_actual']:.4f}"]
        rows.append(cells)
    r0 = next(iter(fused.values()), {})
    return (f"{r0.get('config', {}).get('model')} shapes (n = {_int(r0.get('n'))}), density "
            f"{r0.get('density_target')}, W = {r0.get('world_size')}; ms per step, max over ranks.\n\n"
            + md_table(["scheme", "plain compensate", "plain select", "plain update", "plain compute",
                        "fused compensate", "fused select", "fused update", "fused compute", "floor",
                        "fused compute / floor", "fused step ms", "fused density"], rows)
            + "\n\ncompute = compensate + select + update (the work of the step on a rank, without the exchange). "
              "plain: `MPISPARSE_FUSED=0`, the NumPy steps; fused: the numba passes where a scheme uses them "
              "(`mpisparse/backend/fused.py`: topk, gtopk, the CLT-k leader, threshold, dgc's momentum pass and "
              "dct's per-layer pass; `mpisparse/backend/compiled_compensate.py`: deft's pass with the layer norms "
              "and its own layers' candidates, then its pick; dense and randomk run the same code in both "
              "columns, so their difference is noise). floor (`--floor`): one `e += g` pass over the same length, both ranks at once after "
              "each step of the fused run, timed in the same job as the phases beside it: a pass reading the "
              "gradient and the residual and writing the residual (dgc's own floor reads u, v and the gradient "
              "and writes u and v: 5/3 of it). threshold and dct keep a threshold fixed between "
              "recomputations, so their achieved density (fused density: globally selected entries / n) drifts "
              "above the set one and their update writes that many entries; topk's is the gradient build-up "
              "of two ranks' sets (deft's sets are disjoint).")


def _compute(r: dict[str, Any]) -> float:
    return sum(_phase(r, p) or 0.0 for p in _COMPUTE)


_table(Table(
    name="fused-step",
    title="Compute of one sparse step, plain and fused (`bench step`)",
    about=("The per-rank work of a step of every data-parallel scheme (compensation, selection, update), with "
           "the NumPy steps and with the fused compensate + top-k pass ([schemes.md](../schemes.md))."),
    runs=lambda quick: [Run(label, ["bench", "step", "-n", "2", "--model", "ncf" if quick else "resnet50"]
                            + [a for s in (FUSED_SCHEMES[:3] if quick else FUSED_SCHEMES) for a in ("--scheme", s)]
                            + ["--density", "0.001", "--iters", "2" if quick else "20", "--warmup", "1", "--floor"],
                            env={"MPISPARSE_FUSED": flag})
                        for label, flag in (("plain", "0"), ("fused", "1"))],
    render=_fused_step_render,
))


def _gradient_sources_render(res: dict[str, Any], quick: bool) -> str:
    rows = []
    for label, what in (("synthetic", "drawn (`--gradients synthetic`)"),
                        ("model", "backward passes, each rank's own digits batches (`--gradients model`)")):
        for r in _as_list(res.get(label)):
            rows.append([what, f"`{r['scheme']}`", r["world_size"], r["density_target"], _dens(r["density_actual"]),
                         f"{r['density_actual'] / r['density_target']:.2f}x"])
    r0 = next(iter(_as_list(res.get("model"))), {})
    return (f"{r0.get('config', {}).get('model')}, W = {r0.get('world_size')}; density_actual = distinct indices "
            "updated per step / n, mean over the timed steps.\n\n"
            + md_table(["gradients", "scheme", "W", "density", "density_actual", "build-up"], rows)
            + "\n\nThe DEFT paper (Fig. 1, Sec. 5.2) measured 13.59x at W = 16 on real ResNet-18 gradients "
              "(CIFAR-10, batch 256); here the net is the CIFAR-style ResNet-18 on 8x8 digits images "
              "(batch 32 per rank), trained on with the aggregated update.")


_table(Table(
    name="gradient-sources",
    title="Top-k's build-up on drawn and on real gradients (`bench step --gradients`)",
    about=("How many distinct entries top-k updates per step when every rank selects its own k, with drawn "
           "gradients and with gradients from real backward passes on each rank's own batches."),
    runs=lambda quick: [Run(g, ["bench", "step", "-n", "2" if quick else "16", "--model", "resnet18",
                                "--scheme", "topk", "--scheme", "deft", "--density", "0.01", "--gradients", g,
                                "--iters", "1" if quick else "3", "--warmup", "1"])
                        for g in ("synthetic", "model")],
    render=_gradient_sources_render,
))


def _exchange_render(res: dict[str, Any], quick: bool) -> str:
    results = _as_list(res["exchange"])
    rows = []
    for r in results:
        ph = r.get("exchange_phases") or {}
        first = ph.get("exchange_indices", ph.get("push"))
        second = ph.get("exchange_values", ph.get("pull"))
        rows.append([f"`{r['scheme']}`", r["world_size"], r["density_target"], _int(r.get("k")),
                     _dens(r["density_actual"]), _ms(r.get("exchange_seconds"), 3), _ms(first, 3), _ms(second, 3),
                     _int(r["bytes_sent_per_rank"]), f"{r.get('bytes_per_selected', float('nan')):.2f}",
                     _ms(r["step_seconds"], 3)])
    r0 = results[0] if results else {}
    return (f"{r0.get('config', {}).get('model')} shapes (n = {_int(r0.get('n'))}), W = {r0.get('world_size')}; "
            "times: max over ranks, mean per step.\n\n### Exchange\n\n"
            + md_table(["scheme", "W", "density", "k", "density_actual", "exchange ms", "indices or push ms",
                        "values or pull ms", "bytes/rank/step", "bytes per selected", "step ms"], rows))


_table(Table(
    name="exchange",
    title="Exchange alone, against density (`bench exchange`)",
    about=("Only each scheme's exchange (indices and values) and the bytes it sends, at several densities. On one "
           "machine the first exchange phase also holds the wait for the slowest rank's selection."),
    runs=lambda quick: [Run("exchange", ["bench", "exchange", "-n", "2", "--model", "ncf" if quick else "resnet18"]
                            + [a for s in (("dense", "topk") if quick else ("dense", "topk", "cltk", "deft"))
                               for a in ("--scheme", s)]
                            + ["--densities", "0.01" if quick else "0.001,0.01,0.1",
                               "--iters", "2" if quick else "3", "--warmup", "1"])],
    render=_exchange_render,
))


SCALING_SCHEMES = ("topk", "cltk", "deft", "gtopk", "dgc", "dct")


def _scaling_render(res: dict[str, Any], quick: bool) -> str:
    results = _as_list(res["scaling"])
    order = ["dense", *SCALING_SCHEMES]
    results.sort(key=lambda r: (r.get("config", {}).get("model", ""),
                                order.index(r["scheme"]) if r["scheme"] in order else 99, r["scheme"],
                                r["world_size"], r["density_target"]))
    rows = [[r.get("config", {}).get("model"), f"`{r['scheme']}`", r["world_size"], r["density_target"],
             _ms(r["step_seconds"]), _ratio(r.get("speedup_over_baseline")), r.get("baseline") or "—",
             _int(r["bytes_sent_per_rank"]), _dens(r["density_actual"])] for r in results]
    worlds = sorted({r["world_size"] for r in results})
    schemes = [s for s in dict.fromkeys(r["scheme"] for r in results) if s != "dense"]
    pivot = []
    for s in schemes:
        row = [f"`{s}`"]
        for w in worlds:
            hit = [r for r in results if r["scheme"] == s and r["world_size"] == w]
            row.append(_dens(hit[0]["density_actual"]) if hit else "—")
        pivot.append(row)
    return ("### Step time against W\n\n"
            + md_table(["model", "scheme", "W", "density", "step ms", "speedup", "over", "bytes/rank/step",
                        "density_actual"], rows, right=(2, 3, 4, 5, 7, 8))
            + "\n\nAll schemes of a point run in one job (so they share the machine's state); the speedup is over "
              "the baseline in the same job. Where W exceeds the cores, the step times measure CPU contention as "
              "much as communication.\n\n### Gradient build-up: measured density against W\n\n"
            + md_table(["scheme", *[f"W={w}" for w in worlds]], pivot)
            + "\n\nTarget density: the `density` column above. Schemes whose ranks pick their own sets "
              "(`topk`, `dgc`) build up with W; `cltk`, `deft` and `gtopk` agree on one set; `dct` holds a "
              "threshold for several steps on synthetic gradients that change completely every step, so its "
              "density drifts (see [schemes.md](../schemes.md#dct)).")


_table(Table(
    name="scaling",
    title="Scaling with W and gradient build-up (`bench scaling`)",
    about=("One `bench step` job per world size (all schemes of a point in the same job, with the `dense` "
           "baseline): step time, speedup over dense, bytes and the measured density of the aggregated update."),
    runs=lambda quick: [Run("scaling", ["bench", "scaling", "--worlds", "1,2" if quick else "1,2,4",
                                        "--densities", "0.01", "--model", "ncf" if quick else "resnet18"]
                            + [a for s in (SCALING_SCHEMES[:1] if quick else SCALING_SCHEMES)
                               for a in ("--scheme", s)]
                            + ["--iters", "2" if quick else "3", "--warmup", "1"],
                            out_options={"--out": "scaling"})],
    render=_scaling_render,
))
