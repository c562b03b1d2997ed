"""``mpisparse train``: train a model across ranks with one or more schemes.

One :class:`~mpisparse.config.TrainConfig` per scheme, validated before
MPI starts and compared across ranks at start-up; the runtime that trains
it is :func:`mpisparse.runtimes.train`'s choice.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..config import AMP_MODES, DATASETS, DEVICES, DIR_DATASETS, TRAIN_MODELS, MPConfig, TrainConfig
from ..mpi.device import check_amp_usable, check_device_usable
from ..mpi.launch import under_mpi_launcher, under_torchrun
from ..registry import SCHEMES
from ..results.trace import trace_path
from ..runtimes import check_servers, check_torchrun, schemes_of, train_runtime
from ..train.core import NoProgress
from . import output, session
from .options import (progress_options, trace_option, SectionedCommand, cuda_aware_option, diagnostics_option, mpi_options, output_options,
                      gpt_size_options, table_options, pick_scheme_options, scheme_options, step_options, usage, validated,
                      writable_dir)
from .restarts import check_restart_options, run_with_restarts
from .session import maybe_relaunch, open_comm, open_torch_dist

__all__ = ["train"]


def _split_after(text: str | None) -> list[str]:
    from ..mp.config import parse_split_after

    return usage(parse_split_after, text)


@click.command(cls=SectionedCommand)
@mpi_options
@click.option("--model", type=click.Choice(TRAIN_MODELS), default="mlp",
              show_default=True, help="Network (lstm and gpt are language models: --data pydoc or text; dlrm and "
                                      "ncf recommendation models: --data clicks/criteo and ratings/movielens).")
@click.option("--data", type=click.Choice(DATASETS), default=None,
              help="digits ships with scikit-learn, pydoc (CPython's reference prose, bytes) with Python, clicks "
                   "and ratings are generated: no download; cifar10/text/criteo/movielens read --data-dir. "
                   "[default: pydoc for lstm and gpt, clicks for dlrm, ratings for ncf, else digits]")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="CIFAR-10 binary batches, a text corpus (train.txt/valid.txt/test.txt or wiki.*.tokens), "
                   "Criteo's train.txt or MovieLens' ratings.dat/ratings.csv.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True, default=("dense",),
              show_default=True, help="Scheme; repeat to train once with each and compare.")
@click.option("--density", type=float, default=0.01, show_default=True,
              help="Fraction of elements sent, in (0, 1].")
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--steps-per-epoch", type=click.IntRange(min=0), default=0, show_default=True,
              help="Each epoch takes at most this many of a rank's batches (a language model: the same first "
                   "windows every epoch); 0: the whole shard.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Per rank.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.1, show_default=True)
@click.option("--momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True,
              help="SGD momentum, applied to the aggregated update (DGC applies it itself).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--bptt", type=click.IntRange(min=1), default=35, show_default=True,
              help="The lstm's sequence length (gpt's is --gpt-context).")
@gpt_size_options
@table_options
@click.option("--clip", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Clip the gradient norm to this before the optimizer step (0: off): the aggregate's norm, after the exchange (DDP's contract).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--launcher", type=click.Choice(["auto", "mpi", "torchrun"]), default="auto", show_default=True,
              help="How the ranks talk: mpi (mpiexec, srun, -n), or torchrun (torch.distributed: gloo, or NCCL with "
                   "--device cuda; data-parallel schemes only); auto: torchrun when started by torchrun.")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="cuda: the whole data-parallel step on each rank's GPU (by local rank); needs CuPy and a CUDA torch.")
@step_options
@diagnostics_option
@output_options("Result object (a list with several --scheme).",
                "Per-step log (rank 0's loss, bytes, density, times).",
                "PNG of loss and accuracy against iterations and wall-clock time.")
@click.option("--checkpoint", "checkpoint_dir", type=click.Path(file_okay=False), default=None,
              callback=writable_dir, help="Write a checkpoint here after every epoch (and on SIGUSR1).")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --checkpoint.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="With -n W and --checkpoint: when a rank dies, end the job and start it again from the last "
                   "checkpoint, at most this many times (torchrun's word).")
@click.option("--min-ranks", type=click.IntRange(min=1), default=None,
              help="With --max-restarts: a restart may run on fewer ranks (not below this) when fewer started "
                   "(a host gone); the residuals are redistributed.")
@click.option("--overwrite-checkpoint", is_flag=True,
              help="Start afresh even if --checkpoint already holds a checkpoint (it is replaced).")
@click.option("--overlap", is_flag=True,
              help="Exchange bucket by bucket while backward runs (gradient hooks; dense, layerwise topk, "
                   "threshold with a fixed threshold): the optimized dense baseline is dense with --overlap and "
                   "a 16-bit --wire-dtype.")
@click.option("--amp", type=click.Choice(AMP_MODES), default="none", show_default=True,
              help="Mixed precision: forward and backward under autocast to bfloat16 or float16 (fp16 with a "
                   "GradScaler: a step whose scaled gradient overflows on any rank is skipped on every rank); "
                   "parameters, the scheme and its error feedback stay float32 (data-parallel schemes).")
@click.option("--max-skipped-steps", type=click.IntRange(min=0), default=100, show_default=True,
              help="Stop with an error after this many consecutive skipped steps (non-finite gradient or "
                   "update; 0: never).")
@click.option("--mp-stages", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline (model-parallel) stages S; -n W runs W/S data-parallel replicas of the pipeline.")
@click.option("--split-after", default=None, metavar="LAYER[,LAYER...]",
              help="Split after these layers (S-1 names, e.g. net.2); default: balance parameter counts.")
@click.option("--micro-batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline micro-batches per batch (GPipe schedule).")
@click.option("--dp-scheme", type=click.Choice(schemes_of("collective")),
              default=None, help="With --mp-stages: data-parallel scheme inside each stage's replica group [dense].")
@click.option("--dp-density", type=float, default=None,
              help="With --mp-stages: --density of the --dp-scheme [--density].")
@scheme_options(sorted(SCHEMES), exclude=("momentum",))
@cuda_aware_option
@trace_option
@progress_options
def train(nprocs, timeout, model, data, data_dir, schemes, density, epochs, batch_size, lr, momentum,
          weight_decay, bptt, clip, seed, device, no_memory, check_collectives, diagnostics, json_path, csv_path, plot_path,
          checkpoint_dir, resume, overwrite_checkpoint, max_skipped_steps, mp_stages, split_after, micro_batches, dp_scheme, dp_density, servers,
          cuda_aware=None, hierarchical=False, trace=None, progress_interval=10.0, no_progress=False,
          launcher="auto", overlap=False, max_restarts=0, min_ranks=None, gpt_layers=2, gpt_width=64, gpt_heads=4,
          gpt_context=64, steps_per_epoch=0, amp="none", emb_tables=None, emb_rows=None, emb_dim=16, row_sparse=True,
          **scheme_opts) -> None:
    """Train a model across ranks with one or more schemes; print where the time goes.

    With --mp-stages S the model is split into S pipeline stages; --scheme
    is then how activations cross them (dense, or dct-mp) and --dp-scheme
    runs inside each stage's group of W/S replicas.
    """
    output.configure_progress(progress_interval, not no_progress)
    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(tuple(dict.fromkeys(schemes + ((dp_scheme,) if dp_scheme else ()))),
                                     scheme_opts)
    split_names = _split_after(split_after)
    pipeline = (mp_stages > 1 or bool(split_names) or micro_batches != 1 or dp_scheme is not None
                or dp_density is not None)
    servers = usage(check_servers, schemes, servers)
    cfgs = []
    for s in schemes:
        mp_cfg = (MPConfig(stages=mp_stages, split_after=list(split_names), micro_batches=micro_batches,
                           dp_scheme=dp_scheme or "dense", dp_density=dp_density,
                           dp_options=dict(per_scheme.get(dp_scheme or "dense", {}))) if pipeline else None)
        cfg = TrainConfig(model=model, data=data, data_dir=data_dir, scheme=s, density=density, epochs=epochs,
                          batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay, bptt=bptt,
                          clip=clip, seed=seed, memory=not no_memory,
                          checkpoint=None if checkpoint_dir is None else
                          (checkpoint_dir if len(schemes) == 1 else str(Path(checkpoint_dir) / s)),
                          resume=resume, scheme_options=dict(per_scheme[s]),
                          diagnostics=diagnostics, servers=servers, mp=mp_cfg,
                          check_collectives=check_collectives, hierarchical=hierarchical, cuda_aware=cuda_aware,
                          max_skipped_steps=max_skipped_steps, device=device, overlap=overlap,
                          trace=trace_path(trace, s, len(schemes) > 1), gpt_layers=gpt_layers, gpt_width=gpt_width,
                          gpt_heads=gpt_heads, gpt_context=gpt_context,
                          steps_per_epoch=steps_per_epoch, amp=amp, emb_tables=emb_tables, emb_rows=emb_rows,
                          emb_dim=emb_dim, row_sparse=row_sparse)
        cfgs.append(validated(cfg, nprocs))
    data = cfgs[0].data  # --data, or the model's default
    _check_data_dir(data, data_dir, emb_tables)
    usage(check_device_usable, device, need_torch=True)
    usage(check_amp_usable, device, amp)
    if not (resume or overwrite_checkpoint):
        _refuse_existing_checkpoints(cfgs)
    usage_restarts(max_restarts, min_ranks, nprocs, checkpoint_dir, launcher)
    if min_ranks is not None and any(train_runtime(c).name != "collective" for c in cfgs):
        raise click.UsageError("--min-ranks restarts on fewer ranks, and a pipeline or parameter-server checkpoint "
                               "resumes only on the ranks that wrote it: drop --min-ranks")
    if _torchrun(launcher, nprocs, cfgs):
        comm = open_torch_dist(device, cfgs)
    else:
        if max_restarts and not under_mpi_launcher():
            run_with_restarts(nprocs, timeout, max_restarts, min_ranks, [c.checkpoint for c in cfgs], json_path)
        maybe_relaunch(nprocs, timeout)
        comm = open_comm(nprocs, check=cfgs[0].check_collectives, cuda_aware=cfgs[0].cuda_aware, configs=cfgs,
                         hierarchical=cfgs[0].hierarchical, gpu=cfgs[0].device == "cuda")

    from ..runtimes import train as run_train

    log = output.train_log(comm, csv_path, resume)
    steps: dict[str, list] = {}
    results = []
    stopped: list[str] = []
    for cfg in cfgs:
        s = cfg.scheme
        step_log = output.train_step_log(comm, steps, log, s)
        output.print_train_header(comm, s, model, data, density, epochs)
        try:
            res = run_train(comm, cfg, progress=output.train_progress(comm), step_log=step_log)
        except NoProgress as err:
            # data-parallel ranks stop at the same step: the next scheme may start; other runtimes end here
            if len(cfgs) == 1 or train_runtime(cfg).name != "collective":
                raise
            stopped.append(f"{s}: {err}")
            if comm.rank == 0:
                click.echo(f"{s} stopped (NoProgress); the other schemes go on: {err}", err=True)
            continue
        results.append(res)
        if comm.rank == 0:
            output.print_train_result(res)
    if comm.rank == 0:
        output.finish_train(results, steps, log, json_path, plot_path)
    if stopped:
        # every rank fails next, and a failing rank ends the whole job (main's abort): wait until rank 0 has
        # written the finished schemes' results, or another rank's abort could cut them off
        comm.barrier()
    if hasattr(comm, "close"):  # torch.distributed (torchrun): end the process group on every rank
        comm.close()
        session.END_WITHOUT_TEARDOWN = not stopped
    if stopped:  # the finished schemes' results are written; the job still fails, naming the one that stopped
        raise NoProgress(" | ".join(stopped))


def usage_restarts(max_restarts: int, min_ranks: int | None, nprocs: int | None, checkpoint: str | None,
                   launcher: str) -> None:
    """``--max-restarts``/``--min-ranks`` that cannot work: one line before anything starts."""
    if max_restarts and launcher == "torchrun":
        raise click.UsageError("--max-restarts with --launcher torchrun: torchrun restarts itself (--max-restarts "
                               "of torchrun); drop it here")
    check_restart_options(max_restarts, min_ranks, nprocs, checkpoint)


def _torchrun(launcher: str, nprocs: int | None, cfgs) -> bool:
    """Whether this run talks over torch.distributed (``--launcher torchrun``, or auto under torchrun);
    the options that need MPI are refused in one line."""
    if launcher == "mpi" or (launcher == "auto" and not under_torchrun()):
        return False
    if launcher == "torchrun" and not under_torchrun():
        raise click.UsageError("--launcher torchrun: this process was not started by torchrun (no "
                               "TORCHELASTIC_RUN_ID / WORLD_SIZE); run: torchrun --nproc-per-node W -m mpisparse train ...")
    if nprocs is not None:
        raise click.UsageError(f"-n {nprocs} with torchrun: torchrun decides the processes (--nproc-per-node); "
                               "drop -n")
    for cfg in cfgs:
        usage(check_torchrun, cfg)
        if cfg.hierarchical or cfg.check_collectives or cfg.cuda_aware is not None:
            raise click.UsageError("--hierarchical, --check-collectives and --cuda-aware are MPI settings; "
                                   "under torchrun leave them out")
    return True


def _check_data_dir(data: str, data_dir: str | None, tables: int | None = None) -> None:
    """Outside a launcher (``-n`` or one process): a missing dataset is one line before MPI starts.

    Under a launcher each rank reads its own (maybe node-local) folder and says so itself.
    """
    if data_dir is None or data not in DIR_DATASETS or under_mpi_launcher():
        return
    if not Path(data_dir).is_dir():
        raise click.UsageError(f"--data-dir {data_dir} is not a folder; allowed: an existing folder holding the "
                               f"{data} data")
    from ..data import check_data_dir

    try:
        check_data_dir(data, data_dir, tables)
    except (FileNotFoundError, ValueError) as e:
        raise click.UsageError(f"--data-dir: {e}") from None


def _refuse_existing_checkpoints(cfgs) -> None:
    """A fresh run must not silently replace a checkpoint it was pointed at."""
    dirs = [cfg.checkpoint for cfg in cfgs if cfg.checkpoint]
    if not dirs:
        return
    from ..train.checkpoint import LATEST  # imports torch: only when a checkpoint is asked for

    for d in dirs:
        if (Path(d) / LATEST).exists():
            raise click.UsageError(
                f"--checkpoint {d} already holds a checkpoint; continue it with --resume, "
                "or start afresh and replace it with --overwrite-checkpoint")
