"""The training tables: every data-parallel scheme on the bundled digits, the parameter-server schemes
(training and step time) and model parallelism with DCT-MP (``train``, ``train --servers 1``,
``bench step --servers 1``, ``train --mp-stages S``).
"""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table, _as_list, _dens, _int, _ms, _opts, _pct, _phase, _ratio


TRAIN_SCHEMES = ("dense", "topk", "cltk", "deft", "dct", "gtopk", "dgc", "randomk")


def _train_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in results:
        f = (r.get("metrics") or {}).get("final", {})
        acc = _pct(f.get("test_accuracy")) if "test_accuracy" in f else f"ppl {f.get('test_perplexity', 0):.1f}"
        rows.append([f"`{r['scheme']}`", acc, f"{f.get('test_loss', float('nan')):.4f}", _ms(r["step_seconds"]),
                     _int(r["bytes_sent_per_rank"]), _dens(r["density_actual"]), r.get("skipped_steps", 0)])
    return rows


def _train_digits_render(res: dict[str, Any], quick: bool) -> str:
    results = _as_list(res["train"])
    cfg = results[0].get("config", {}) if results else {}
    return (f"MLP on the bundled digits, W = {results[0]['world_size'] if results else '?'}, density "
            f"{cfg.get('density')}, {cfg.get('epochs')} epochs, batch {cfg.get('batch_size')} per rank, SGD lr "
            f"{cfg.get('lr')} momentum {cfg.get('momentum')}, random seed {cfg.get('seed')}. Test accuracy and loss of the "
            "final model; step ms is the slowest rank's mean step. `--max-skipped-steps 0`: a scheme that "
            "diverges runs all its epochs and shows it here (its skipped steps counted) rather than stopping "
            "after 100 skipped steps in a row.\n\n### Schemes\n\n"
            + md_table(["scheme", "test accuracy", "test loss", "step ms", "bytes/rank/step", "density_actual",
                        "skipped steps"], _train_rows(results)))


_table(Table(
    name="train-digits",
    title="Training on the bundled digits, 2 ranks (`train`)",
    about=("Every data-parallel scheme trains the same MLP from the same seed on 2 ranks; accuracy, bytes each "
           "rank sends per step and the measured density of the aggregated update."),
    runs=lambda quick: [Run("train", ["train", "-n", "2"]
                            + [a for s in (TRAIN_SCHEMES[:2] if quick else TRAIN_SCHEMES) for a in ("--scheme", s)]
                            + ["--density", "0.01", "--max-skipped-steps", "0"]
                            + (["--epochs", "1"] if quick else []))],
    render=_train_digits_render,
))


#: (label, schemes, options) of the parameter-server training runs
PS_TRAIN = (
    ("slimdp", ("plumpdp", "slimdp"), ["--density", "0.3", "--core", "0.15"]),
    ("dgs", ("asgd", "dgs"), ["--density", "0.01", "--lr", "0.02"]),
    ("dgs-server", ("dgs",), ["--density", "0.01", "--server-density", "0.01", "--lr", "0.02"]),
    ("asgd-dropping", ("asgd",), ["--worker-density", "0.01", "--lr", "0.02"]),
)


def _ps_train_render(res: dict[str, Any], quick: bool) -> str:
    rows = []
    for label, _, _ in PS_TRAIN:
        for r in _as_list(res.get(label)):
            f = (r.get("metrics") or {}).get("final", {})
            opts = ", ".join(x for x in (f"density={r['density_target']}", _opts(r)) if x)
            rows.append([f"`{r['scheme']}`", opts, _pct(f.get("test_accuracy")),
                         _int(r.get("bytes_up_per_communication")), _int(r.get("bytes_down_per_communication")),
                         f"{r.get('staleness_mean', 0):.2f}", _ms(r["step_seconds"]), r.get("skipped_steps", 0)])
    r0 = next((r for v in res.values() for r in _as_list(v)), {})
    cfg = r0.get("config", {})
    return (f"MLP on digits, {r0.get('workers', '?')} workers + {r0.get('servers', '?')} server, "
            f"{cfg.get('epochs')} epochs, batch {cfg.get('batch_size')} per worker, random seed {cfg.get('seed')}; test "
            "accuracy of the servers' final model; bytes per push (up) and per answer (down).\n\n"
            "### Parameter-server training\n\n"
            + md_table(["scheme", "options", "test accuracy", "bytes up / comm", "bytes down / comm",
                        "mean staleness", "step ms", "skipped steps"], rows, right=range(2, 8)))


_table(Table(
    name="ps-train",
    title="Parameter-server schemes: training on digits (`train --servers 1`)",
    about=("Slim-DP against its dense baseline Plump-DP, DGS against dense asynchronous SGD, with 2 workers and "
           "1 server. The asynchronous runs use a smaller learning rate than the default (with two workers each "
           "push is a full SGD step, and stale)."),
    runs=lambda quick: [Run(label, ["train", "-n", "3", "--servers", "1"]
                            + [a for s in schemes for a in ("--scheme", s)] + opts
                            + ["--epochs", "1" if quick else "10"])
                        for label, schemes, opts in (PS_TRAIN[:1] if quick else PS_TRAIN)],
    render=_ps_train_render,
))


def _ps_step_render(res: dict[str, Any], quick: bool) -> str:
    rows = []
    for label in sorted(res):
        for r in _as_list(res[label]):
            pw = r.get("phases_worker") or {}

            def ph(name: str) -> str:
                v = pw.get(name)
                if isinstance(v, dict):
                    v = v.get("max")
                return _ms(v) if v is not None else "—"

            ps = r.get("phases_server") or {}
            sa = ps.get("server_apply")
            opts = ", ".join(x for x in (f"density={r['density_target']}", _opts(r)) if x)
            rows.append([f"`{r['scheme']}`", opts, _ms(r["step_seconds"]), ph("compensate"),
                         ph("select"), ph("push"), ph("wait"), ph("pull"), ph("update"),
                         _ms(sa.get("max") if isinstance(sa, dict) else sa),
                         _int(r.get("bytes_up_per_communication")), _int(r.get("bytes_down_per_communication"))])
    r0 = next((r for v in res.values() for r in _as_list(v)), {})
    return (f"{r0.get('config', {}).get('model')} shapes (n = {_int(r0.get('n'))}), {r0.get('workers', '?')} "
            f"workers + {r0.get('servers', '?')} server; ms per worker step (max over workers), server_apply per "
            "push served.\n\n### Parameter-server step\n\n"
            + md_table(["scheme", "options", "step ms", "compensate", "select", "push", "wait", "pull", "update",
                        "server_apply", "bytes up / comm", "bytes down / comm"], rows, right=range(2, 12)))


_table(Table(
    name="ps-step",
    title="Parameter-server schemes: step time on model-shaped gradients (`bench step --servers 1`)",
    about=("Where a parameter-server step's time goes, on synthetic gradients, over shared memory: the byte "
           "savings pay off only where the link is the bottleneck."),
    runs=lambda quick: [
        Run("slimdp", ["bench", "step", "-n", "3", "--servers", "1", "--model", "ncf" if quick else "resnet18",
                       "--scheme", "plumpdp", "--scheme", "slimdp", "--density", "0.3", "--core", "0.15",
                       "--iters", "2" if quick else "10", "--warmup", "1"]),
        *([] if quick else [
            Run("dgs", ["bench", "step", "-n", "3", "--servers", "1", "--model", "resnet18", "--scheme", "asgd",
                        "--scheme", "dgs", "--density", "0.01", "--server-density", "0.01", "--iters", "10",
                        "--warmup", "1"])])],
    render=_ps_step_render,
))


#: (label, -n, options) of the pipeline runs; every one adds the common options
MP_RUNS = (
    ("mlp2-d0.1", 2, ["--mp-stages", "2", "--scheme", "dense", "--scheme", "dct-mp", "--density", "0.1"]),
    ("mlp2-d0.05", 2, ["--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.05"]),
    ("mlp2-laplace", 2, ["--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.1", "--mp-threshold",
                         "laplace"]),
    ("mlp2-micro4", 2, ["--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.1", "--micro-batches", "4"]),
    ("mlp3-d0.1", 3, ["--mp-stages", "3", "--scheme", "dense", "--scheme", "dct-mp", "--density", "0.1"]),
    ("cnn2-d0.1", 2, ["--mp-stages", "2", "--model", "cnn", "--scheme", "dense", "--scheme", "dct-mp",
                      "--density", "0.1"]),
    ("dlrm3-d0.25", 3, ["--mp-stages", "3", "--model", "dlrm", "--data", "digits", "--split-after", "bottom.4,top.3",
                        "--scheme", "dense", "--scheme", "dct-mp", "--density", "0.25"]),
    ("hybrid-dense", 4, ["--mp-stages", "2", "--scheme", "dense"]),
    ("hybrid-dct", 4, ["--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.1", "--dp-scheme", "dct",
                       "--lifespan", "10"]),
)
MP_COMMON = ["--lr", "0.05", "--batch-size", "64"]


def _mp_render(res: dict[str, Any], quick: bool) -> str:
    rows, prow = [], []
    for label, _, _ in MP_RUNS:
        for r in _as_list(res.get(label)):
            mp = r.get("mp") or {}
            f = (r.get("metrics") or {}).get("final", {})
            best = max((e.get("test_accuracy", 0.0) for e in (r.get("metrics") or {}).get("per_epoch", [])),
                       default=None)
            splits = mp.get("splits") or []
            fwd = " / ".join(_int(s.get("bytes_forward")) for s in splits) or "—"
            bwd = " / ".join(_int(s.get("bytes_backward")) for s in splits) or "—"
            enc = ", ".join(sorted({e for s in splits for e in (s.get("mask_encodings") or {})})) or "—"
            cfg = r.get("config", {})
            scheme = r["scheme"] + (f", dp {mp.get('dp_scheme')}" if mp.get("replicas", 1) > 1 else "")
            rows.append([label, cfg.get("model"), ", ".join(mp.get("split_after") or []) or "—",
                         f"{mp.get('stages')} x {mp.get('replicas')}", scheme,
                         f"{'—' if r['scheme'] == 'dense' else r['density_target']} / {r['density_actual']:.4f}",
                         f"{_pct(f.get('test_accuracy'))} ({_pct(best)})", fwd, bwd,
                         f"{_ratio(mp.get('compression_factor'))} ({enc})"])
            dp = sum(v for k, v in (r.get("phases") or {}).items() if k in ("exchange_indices", "exchange_values"))
            prow.append([label, scheme] + [_ms(_phase(r, p), 3) for p in
                                           ("forward", "backward", "send_activations", "send_gradients", "wait")]
                        + [_ms(dp, 3) if dp else "—", _ms(_phase(r, "update"), 3), _ms(r["step_seconds"], 3)])
    r0 = next((r for v in res.values() for r in _as_list(v)), {})
    cfg = r0.get("config", {})
    return (f"Digits, lr {cfg.get('lr')}, batch {cfg.get('batch_size')} per replica; {cfg.get('epochs')} epochs "
            "(DLRM: see the commands). `density target / kept`: `--density` and the kept fraction of the "
            "activation entries sent; accuracy: final (best epoch); bytes per step per split (max over "
            "replicas), splits separated by `/`.\n\n### Accuracy and bytes\n\n"
            + md_table(["run", "model", "split after", "stages x replicas", "scheme", "density target / kept",
                        "test acc final (best)", "fwd B/step per split", "bwd B/step per split",
                        "compression (mask)"], rows, right=(5, 6, 7, 8, 9))
            + "\n\n### Time per phase (ms per step, max over ranks)\n\n"
            + md_table(["run", "scheme", "forward", "backward", "send_activations", "send_gradients", "wait",
                        "DP exchange", "update", "step"], prow, right=range(2, 10))
            + "\n\n`DP exchange`: `exchange_indices` + `exchange_values` of the data-parallel scheme inside each "
              "stage's replica group. Over shared memory, kilobyte messages cost scheduling more than bandwidth "
              "where ranks outnumber cores: `wait` holds the pipeline bubble and descheduled ranks.")


def _mp_runs(quick: bool) -> list[Run]:
    runs = MP_RUNS[:1] if quick else MP_RUNS
    out = []
    for label, n, opts in runs:
        epochs = "1" if quick else ("10" if "dlrm" in opts else "5")
        out.append(Run(label, ["train", "-n", str(n), *opts, *MP_COMMON, "--epochs", epochs]))
    return out


_table(Table(
    name="mp-train",
    title="Model parallelism and DCT-MP: pipelines on digits (`train --mp-stages S`)",
    about=("Pipelines of 2 and 3 stages with uncompressed activations against DCT-MP, the Laplace threshold, "
           "micro-batches, the DLRM-like MLP with two splits, and hybrid 2 stages x 2 replicas with DCT-DP inside "
           "each stage's replica group."),
    runs=_mp_runs,
    render=_mp_render,
))


#: (label, options) of the local-update runs: each `train -n 2` on digits with the defaults of train-digits
LOCALSGD_RUNS = (
    ("h8", ["--scheme", "dense", "--scheme", "localsgd"]),
    ("h4", ["--scheme", "localsgd", "--local-steps", "4"]),
    ("h16", ["--scheme", "localsgd", "--local-steps", "16"]),
    ("h32", ["--scheme", "localsgd", "--local-steps", "32"]),
    ("diloco", ["--scheme", "localsgd", "--outer-lr", "0.7", "--outer-momentum", "0.9"]),
    ("diloco-inner-m0", ["--scheme", "dense", "--scheme", "localsgd", "--outer-lr", "0.7", "--outer-momentum", "0.9",
                         "--momentum", "0"]),
)


def _localsgd_render(res: dict[str, Any], quick: bool) -> str:
    rows = []
    for label, _ in LOCALSGD_RUNS:
        for r in _as_list(res.get(label)):
            cfg, f = r.get("config", {}), (r.get("metrics") or {}).get("final", {})
            local = r["scheme"] == "localsgd"
            rows.append([label, f"`{r['scheme']}`", cfg.get("scheme.local_steps", "—") if local else "—",
                         cfg.get("scheme.outer_lr", "—") if local else "—",
                         cfg.get("scheme.outer_momentum", "—") if local else "—", cfg.get("momentum"),
                         _pct(f.get("test_accuracy")), f"{f.get('test_loss', float('nan')):.4f}",
                         _int(r["bytes_sent_per_rank"]), _dens(r["density_actual"]), _ms(r["step_seconds"])])
    cfg = next((r for label, _ in LOCALSGD_RUNS for r in _as_list(res.get(label))), {}).get("config", {})
    out = (f"MLP on the bundled digits, W = 2, {cfg.get('epochs')} epochs, batch {cfg.get('batch_size')} per rank, "
           f"SGD lr {cfg.get('lr')} as the inner optimizer (its momentum in the column), random seed "
           f"{cfg.get('seed')}. H: `--local-steps`; outer lr and momentum 1 and 0: plain averaging, else DiLoCo's "
           "outer Nesterov step. Test accuracy and loss of the final model (an epoch that ends between two syncs "
           "evaluates each rank's own parameters on its share of the test set); density_actual: the fraction of "
           "steps that synchronized; step ms: the slowest rank's mean step over shared memory.\n\n"
           "### Accuracy, bytes and density\n\n"
           + md_table(["run", "scheme", "H", "outer lr", "outer momentum", "inner momentum", "test accuracy",
                       "test loss", "bytes/rank/step", "density_actual", "step ms"], rows, right=range(2, 11)))
    tta = res.get("tta")
    if tta:
        trows = [[f"`{x['label']}`", "not reached" if not x["reached"] else str(x["steps_to_target"]),
                  f"{100 * x['final_accuracy']:.1f} %", str(x["steps"]), f"{x['bytes_per_step']:,.0f}",
                  f"{x['density']:.4f}", f"{1e3 * x['step_seconds']:.1f}"] for x in tta["rows"]]
        out += (f"\n\n### Steps to target (`bench tta`)\n\n{tta['model']} on {tta['data']}, W = {tta['world_size']} "
                f"over shared memory (one host), batch {tta['batch_size']} per rank, SGD lr {tta['lr']} momentum "
                f"{tta['momentum']}; target {100 * tta['target']:.0f} % test accuracy, at most {tta['max_steps']} "
                f"steps, evaluated every {tta['eval_every']} steps ({_eval_point(tta)}). The steps to target are "
                "what the advisor needs; the step times over shared memory are not a cluster's.\n\n"
                + md_table(["scheme", "steps to target", "final accuracy", "steps", "bytes/rank/step", "density",
                            "step ms"], trows))
    return out


def _eval_point(tta: dict[str, Any]) -> str:
    """Where bench tta's evaluations fall in localsgd's periods."""
    from mpisparse.schemes.localsgd import LOCAL_STEPS

    row = next((x for x in tta["rows"] if x["scheme"] == "localsgd"), None)
    h = (row or {}).get("options", {}).get("local_steps") or LOCAL_STEPS.default
    return (f"localsgd, H = {h}: right after a sync" if tta["eval_every"] % h == 0 else
            f"localsgd, H = {h}: also between syncs, each rank's own parameters")


def _localsgd_runs(quick: bool) -> list[Run]:
    runs = [Run(label, ["train", "-n", "2", *opts, "--max-skipped-steps", "0"] + (["--epochs", "1"] if quick else []))
            for label, opts in (LOCALSGD_RUNS[:1] if quick else LOCALSGD_RUNS)]
    tta = (["--quick"] if quick else ["--model", "mlp", "--target", "0.95", "--max-steps", "400", "--eval-every", "8"])
    return runs + [Run("tta", ["bench", "tta", "-n", "2", *tta, "--scheme", "dense-opt", "--scheme", "dense",
                               "--scheme", "localsgd", "--no-progress"])]


_table(Table(
    name="localsgd",
    title="Local SGD and DiLoCo on the bundled digits, 2 ranks (`train`, `bench tta`)",
    about=("`localsgd` against dense: the period H, DiLoCo's outer step (with train's SGD as the inner optimizer, "
           "with and without its momentum), accuracy in the same epochs, bytes and the fraction of steps that "
           "communicate; then the steps to a target accuracy."),
    runs=_localsgd_runs,
    render=_localsgd_render,
))
