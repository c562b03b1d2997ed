"""``mpisparse bench tta``: time to target, one model trained with each scheme (:mod:`mpisparse.bench.tta`).

Every configuration is validated before MPI starts (a bad value is one
line and exit 2); the runs train through the training runtime one after
another on the same ranks.
"""

from __future__ import annotations

import os
import socket

import click

from ..config import (CLICK_DATASETS, DATASETS, DEVICES, LM_MODELS, RATING_DATASETS, TRAIN_MODELS, TrainConfig,
                      default_data)
from ..mpi.device import check_device_usable
from ..runtimes import schemes_of
from . import output
from .options import (SectionedCommand, check_plot, mpi_options, pick_scheme_options, progress_options,
                      scheme_options, table_options, usage, validated, writable_file)
from .session import maybe_relaunch, open_comm

__all__ = ["bench_tta"]

_BASELINE = "dense-opt"  # mpisparse.bench.tta.BASELINE (that module imports numpy; this one stays light)
_DEFAULTS = (_BASELINE, "dense", "topk", "cltk", "deft", "powersgd")
_QUICKABLE = ("model", "target", "target_loss", "max_steps", "eval_every")


@click.command("tta", cls=SectionedCommand)
@mpi_options
@click.option("--model", type=click.Choice(TRAIN_MODELS), default="resnet18", show_default=True,
              help="The model trained, any of train's (resnet18: 11.2 M parameters, a gradient the network feels; "
                   "lstm, gpt: language models).")
@click.option("--data", type=click.Choice(DATASETS), default=None,
              help="As train's: digits ships with scikit-learn, pydoc with Python; cifar10 and text read --data-dir "
                   "[default: pydoc for lstm and gpt, else digits].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="CIFAR-10 binary batches, or a text corpus.")
@click.option("--scheme", "schemes", type=click.Choice([_BASELINE] + schemes_of("collective")), multiple=True,
              default=_DEFAULTS, show_default=True,
              help=f"Repeatable. {_BASELINE}: the optimized dense baseline (dense, a 16-bit wire, --overlap); "
                   "dense: float32 dense, no overlap; any other: that data-parallel scheme as `train` runs it.")
@click.option("--target", type=float, default=None,
              help="Test accuracy to reach, in (0, 1]: a classifier's target [0.9]; dlrm on clicks: held-out AUC "
                   "[0.75]; ncf: held-out hit rate @10 [0.35].")
@click.option("--target-loss", type=float, default=None,
              help="Held-out (test) loss to reach, > 0: a language model's target [2.5], or a classifier's.")
@click.option("--target-ppl", type=float, default=None,
              help="Held-out perplexity to reach, > 1 (a language model; instead of --target-loss).")
@click.option("--max-steps", type=click.IntRange(min=1), default=300, show_default=True,
              help="Step budget of each run (a run that does not reach the target stops here).")
@click.option("--eval-every", type=click.IntRange(min=1), default=10, show_default=True,
              help="Evaluate on the whole test set every N steps (untimed; steps to target are a multiple of N).")
@click.option("--density", type=float, default=0.01, show_default=True, help="Density of the sparse schemes.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Per rank.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True)
@click.option("--momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="cuda: each rank's whole step on its GPU (as train --device cuda); needs CuPy and a CUDA torch.")
@click.option("--baseline-wire", type=click.Choice(["float16", "bfloat16"]), default="float16", show_default=True,
              help=f"The wire dtype of {_BASELINE}.")
@click.option("--quick", is_flag=True,
              help="CI form: mlp, target 0.8 (a language model: loss 3.5), 40 steps, evaluated every 5 (options "
                   "given still win; MPISPARSE_QUICK=1: target 0.5 (loss 4.5), 12 steps, every 4).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Every run's row (docs/performance.md#time-to-accuracy) and provenance.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="PNG: the target's metric against training wall-clock, a line per scheme.")
@table_options
@scheme_options(schemes_of("collective"), exclude=("momentum",))
@progress_options
def bench_tta(nprocs, timeout, model, data, data_dir, schemes, target, target_loss, target_ppl, max_steps, eval_every,
              density, batch_size, lr, momentum, seed, device, baseline_wire, quick, json_path, plot_path,
              progress_interval=10.0, no_progress=False, emb_tables=None, emb_rows=None, emb_dim=16, row_sparse=True,
              **scheme_opts) -> None:
    """Time to target: train one model with each scheme until a target (a classifier's test accuracy, a language
    model's held-out loss or perplexity) or a step budget.

    Prints per scheme the steps and wall-clock to the target, the final
    value of the target's metric, bytes per step and the mean step split into
    compute, exposed exchange and exchange hidden behind backward. Compute is
    this machine's CPU. Run it with -n W, or inside `bin/emucluster run H --rate R --`.
    """
    from ..bench import tta

    output.configure_progress(progress_interval, not no_progress)
    defaults = {}
    if quick:
        ctx = click.get_current_context()
        size = "tiny" if os.environ.get("MPISPARSE_QUICK") == "1" else "quick"
        given = {k: v for k, v in dict(model=model, max_steps=max_steps, eval_every=eval_every).items()
                 if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
        picked = {**tta.QUICK[size], **given}
        model, max_steps, eval_every = picked["model"], picked["max_steps"], picked["eval_every"]
        defaults = {"accuracy": picked["target"], "loss": picked["target_loss"]}
    data_name = data or default_data(model)
    metric = "auc" if data_name in CLICK_DATASETS else "hit_rate" if data_name in RATING_DATASETS else "accuracy"
    goal = usage(tta.pick_target, model in LM_MODELS, accuracy=target, loss=target_loss, ppl=target_ppl,
                 defaults=defaults, metric=metric)
    names = tuple(dict.fromkeys(schemes))
    registered = tuple(dict.fromkeys("dense" if n == tta.BASELINE else n for n in names))
    runs = tta.plan_runs(names, pick_scheme_options(registered, scheme_opts), baseline_wire)
    cfgs = [validated(TrainConfig(model=model, data=data, data_dir=data_dir, scheme=r.scheme, density=density,
                                  epochs=1, batch_size=batch_size, lr=lr, momentum=momentum, seed=seed,
                                  scheme_options=dict(r.options), overlap=r.overlap, max_skipped_steps=0,
                                  device=device, emb_tables=emb_tables, emb_rows=emb_rows, emb_dim=emb_dim,
                                  row_sparse=row_sparse), nprocs)
            for r in runs]
    data = cfgs[0].data  # --data, or the model's default
    if data in ("cifar10", "text", "criteo", "movielens") and not os.path.isdir(data_dir or ""):
        raise click.UsageError(f"--data-dir {data_dir!r} is not a directory")
    check_plot(plot_path)
    usage(check_device_usable, device, need_torch=True)
    maybe_relaunch(nprocs, timeout)

    from ..results.files import write_json
    from ..results.provenance import gather_provenance

    comm = open_comm(nprocs, configs=cfgs, gpu=device == "cuda")
    rows = []
    for run, cfg in zip(runs, cfgs):
        if comm.rank == 0:
            click.echo(f"== {run.label}: {model} on {data}, W={comm.size}, to {goal.describe()} or "
                       f"{max_steps} steps", err=True)
        rows.append(tta.run_tta(comm, cfg, run, target=goal, max_steps=max_steps, eval_every=eval_every,
                                progress=output.train_progress(comm, run.label)))
    hosts = len(set(comm.allgather_obj(socket.gethostname())))
    prov = gather_provenance(comm)
    if comm.rank == 0:
        res = {"command": "bench tta", "model": model, "data": data, "world_size": comm.size, "hosts": hosts,
               "target": goal.value, "target_metric": goal.metric, "max_steps": max_steps, "eval_every": eval_every,
               "batch_size": batch_size,
               "lr": lr, "momentum": momentum, "density": density, "seed": seed, "baseline": tta.BASELINE,
               "baseline_wire_dtype": baseline_wire, "quick": quick, "device": device,
               "compute_note": tta.compute_note(device), "rows": rows, "row_sparse": row_sparse,
               "provenance": prov}
        click.echo(tta.format_tta(res))
        write_json(json_path, res)
        if plot_path:
            tta.plot_tta(res, plot_path)
