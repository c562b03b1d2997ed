"""``mpisparse bench step|exchange|select|scaling``.

The work is in :mod:`mpisparse.bench` and the runtimes
(:func:`mpisparse.runtimes.bench_step`); what is printed and written is
:mod:`mpisparse.cli.output`.  Heavy imports stay inside the commands.
"""

from __future__ import annotations

import click

from ..config import DEVICES, GRADIENT_SOURCES, STEP_OUTPUTS, BenchConfig
from ..mpi.device import check_device_usable
from ..models.shapes import model_names
from ..registry import SCHEMES, validate_density
from ..results.trace import trace_path
from ..runtimes import bench_schemes, check_servers
from . import output
from .options import (progress_options, trace_option, SectionedCommand, check_plot, cuda_aware_option, density_list, diagnostics_option, int_list,
                      mpi_options, output_options, pick_scheme_options, scheme_options, size_list, step_options, usage,
                      validated, out_dir_or_default, writable_dir, writable_file)
from .session import maybe_relaunch, open_comm

__all__ = ["bench", "bench_exchange", "bench_overlap", "bench_scaling", "bench_select", "bench_step"]


@click.group()
def bench() -> None:
    """Benchmarks: `step` (sparsified steps), `exchange` (collective patterns), `overlap` (exchange
    overlapped with backward), `select` (kernels), `scaling` (sweeps of W and density), `model` (the
    cost model, no MPI), `tta` (time to accuracy, each scheme trained to a target)."""


# --------------------------------------------------------------------------- step
def _steps(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of step numbers") from None
    if not out:
        raise click.BadParameter(f"{value!r}: give at least one step number")
    return out


#: the schemes ``bench overlap`` runs bucket by bucket (:func:`mpisparse.torch.overlap.overlap_refusal` says
#: which of their options it needs)
OVERLAP_SCHEMES = ["dense", "threshold", "topk"]


@bench.command("step", cls=SectionedCommand)
@mpi_options
@click.option("--model", type=click.Choice(model_names()), default="resnet18", show_default=True,
              help="Gradients shaped like this model's layers.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("dense", "topk"), show_default=True,
              help="Scheme to run; repeat to compare several in one job.")
@click.option("--density", type=float, default=0.01, show_default=True,
              help="Fraction of elements sent, in (0, 1].")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic gradients.")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="cuda: the whole data-parallel step on each rank's GPU (by local rank); needs CuPy.")
@click.option("--gradients", type=click.Choice(GRADIENT_SOURCES), default="synthetic", show_default=True,
              help="synthetic: drawn, model-shaped; model: backward passes of the trainable net of that "
                   "name (resnet18) on each rank's own batches of the digits data, trained on with the "
                   "scheme's update.")
@step_options
@diagnostics_option
@output_options("Write the result object (a list with several --scheme) to this file.",
                "One row per scheme: the result's scalars and per-phase ms.",
                "PNG: per-phase time per step (stacked) and bytes per rank, one bar per scheme.")
@click.option("--rss-at", "rss_at", default=None, callback=lambda ctx, param, v: None if v is None else _steps(v), metavar="STEP[,STEP...]",
              help="Collective schemes: record each rank's resident memory after these steps (warm-up "
                   "included; the result's rss_bytes_at_step, max over ranks), e.g. 200,2000 to look for a leak.")
@click.option("--separate-wait", is_flag=True,
              help="Data-parallel schemes: a barrier before every collective, its time in phase 'wait', so the "
                   "exchange phases hold the transfer alone (not the wait for the slowest rank).")
@click.option("--output", "step_output", type=click.Choice(STEP_OUTPUTS), default="own", show_default=True,
              help="Data-parallel schemes: own = the update in the scheme's reused output vector (only the last "
                   "step's entries cleared); gradient = written into the gradient buffer (as "
                   "DistributedOptimizer does): one full buffer less, one zeroing pass more.")
@click.option("--floor", is_flag=True,
              help="Data-parallel schemes: after each step every rank times one e += g pass (the floor of a "
                   "step's compute) into a buffer of its own (one buffer more in the peak RSS); the table "
                   "adds compute / floor.")
@click.option("--torch-peer", is_flag=True,
              help="Also run the same top-k exchange written in plain PyTorch (torch.topk over the whole vector, "
                   "gather by index, the same MPI calls) on the same device, and print it per phase beside the "
                   "toolkit's topk (needs torch; imported only with this flag).")
@scheme_options(bench_schemes())
@cuda_aware_option
@trace_option
@progress_options
def bench_step(nprocs, timeout, model, schemes, density, iters, warmup, seed, device, no_memory,
               check_collectives, diagnostics, json_path, csv_path, plot_path, rss_at, servers, cuda_aware=None,
               hierarchical=False, gradients="synthetic", trace=None, progress_interval=10.0, no_progress=False,
               separate_wait=False, step_output="own", floor=False, torch_peer=False, **scheme_opts) -> None:
    """Time sparsified steps of one or more schemes; print the per-phase table."""
    output.configure_progress(progress_interval, not no_progress)
    if torch_peer:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise click.UsageError("--torch-peer needs torch (pip install -e '.[train]'); it is not installed")
        if gradients != "synthetic" or hierarchical:
            raise click.UsageError("--torch-peer runs on synthetic gradients over a flat communicator: "
                                   "drop --gradients model / --hierarchical")
    schemes = tuple(dict.fromkeys(schemes))  # repeated names run once
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    servers = usage(check_servers, schemes, servers)
    cfgs = [validated(BenchConfig(model=model, scheme=s, density=density, iters=iters, warmup=warmup, seed=seed,
                                  memory=not no_memory, scheme_options=dict(per_scheme[s]),
                                  diagnostics=diagnostics, servers=servers, check_collectives=check_collectives,
                                  hierarchical=hierarchical, cuda_aware=cuda_aware, rss_at=list(rss_at or ()), device=device,
                                  gradients=gradients, trace=trace_path(trace, s, len(schemes) > 1),
                                  separate_wait=separate_wait, output=step_output, floor=floor,
                                  torch_peer=torch_peer), nprocs)
            for s in schemes]
    usage(check_device_usable, device, need_torch=False)
    check_plot(plot_path)
    maybe_relaunch(nprocs, timeout)

    from ..runtimes import bench_step as run_bench_step

    comm = open_comm(nprocs, check=cfgs[0].check_collectives, cuda_aware=cfgs[0].cuda_aware, configs=cfgs,
                     hierarchical=cfgs[0].hierarchical, gpu=cfgs[0].device == "cuda")
    results = []
    for cfg in cfgs:
        res = run_bench_step(comm, cfg, progress=output.progress(comm, f"{cfg.scheme}: step"))
        results.append(res)
        if comm.rank == 0:
            output.print_step_result(res)
    if cfgs[0].torch_peer:
        from ..bench.torch_peer import NAME, format_peer_table, run_torch_peer

        res = run_torch_peer(comm, cfgs[0], progress=output.progress(comm, f"{NAME}: step"))
        results.append(res)
        if comm.rank == 0:
            output.print_step_result(res)
            table = format_peer_table(results)
            if table:
                click.echo("\n" + table)
    if comm.rank == 0:
        output.finish_step(results, json_path, csv_path, plot_path)


# --------------------------------------------------------------------------- overlap
@bench.command("overlap", cls=SectionedCommand)
@mpi_options
@click.option("--model", type=click.Choice(["mlp", "cnn", "resnet18", "gpt"]), default="resnet18", show_default=True,
              help="The net trained (each rank its own random batches: CIFAR-shaped images; gpt: windows of random "
                   "tokens, its default size).")
@click.option("--scheme", "schemes", type=click.Choice(OVERLAP_SCHEMES), multiple=True,
              default=("dense",), show_default=True,
              help="Repeatable. Schemes that run bucket by bucket: dense, topk with --layerwise, threshold with "
                   "--threshold.")
@click.option("--density", type=float, default=0.01, show_default=True, help="Density of the sparse schemes.")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True, help="Samples per rank per step.")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps per way.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed steps first.")
@click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True), default=25.0, show_default=True,
              help="Least size of a bucket (MB of float32 gradients).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the net and the batches.")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="cuda: the net, the batches and the exchange on each rank's GPU (by local rank); needs CuPy.")
@click.option("--ddp", is_flag=True,
              help="Also DDP over torch.distributed (gloo; NCCL too with cuda) started from the MPI ranks: its "
                   "buckets through mpisparse's hook exchanged in backward and overlapped, and DDP's own allreduce "
                   "(dense); the hook's hidden share beside the library's. Across hosts rank 0's MASTER_ADDR, if "
                   "set, is the address the others connect to.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Write the rows (and provenance) to this file.")
@scheme_options(OVERLAP_SCHEMES)
def bench_overlap(nprocs, timeout, model, schemes, density, batch, iters, warmup, bucket_cap_mb, seed, device,
                  json_path, ddp=False, **scheme_opts) -> None:
    """Step time with the exchange after backward vs overlapped with it (gradient hooks), side by side."""
    from ..torch.overlap import overlap_refusal

    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    for s in schemes:
        usage(validate_density, density)
        why = overlap_refusal(s, per_scheme[s])
        if why is not None:
            raise click.UsageError(why.replace("overlap=True: ", "").replace("layerwise=True", "--layerwise")
                                   .replace("a fixed threshold", "--threshold T"))
    usage(check_device_usable, device, need_torch=True)
    maybe_relaunch(nprocs, timeout)

    from ..bench.overlap import format_overlap, run_overlap
    from ..results.files import write_json
    from ..results.provenance import gather_provenance

    comm = open_comm(nprocs, gpu=device == "cuda")
    say = (lambda name: click.echo(f"{name}: done", err=True)) if comm.rank == 0 else None
    res = run_overlap(comm, model=model, schemes=[(s, per_scheme[s]) for s in schemes], density=density,
                      batch=batch, iters=iters, warmup=warmup, bucket_cap_mb=bucket_cap_mb, seed=seed, progress=say,
                      device=device, ddp=ddp)
    prov = gather_provenance(comm)
    if comm.rank == 0:
        click.echo(format_overlap(res))
        write_json(json_path, {**res, "provenance": prov})


# --------------------------------------------------------------------------- exchange
@bench.command("exchange", cls=SectionedCommand)
@mpi_options
@click.option("--model", type=click.Choice(model_names()), default="resnet18", show_default=True,
              help="Gradients shaped like this model's layers.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("dense", "topk", "cltk", "deft"), show_default=True,
              help="Scheme whose exchange is timed; repeat for several.")
@click.option("--densities", default="0.001,0.01,0.1", show_default=True, callback=density_list,
              metavar="D[,D...]", help="Densities to run each scheme at.")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True, help="Timed steps per point.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic gradients.")
@step_options
@output_options("The per-run result objects (a list), with the exchange keys added.",
                "One row per scheme and density.",
                "PNG: exchange time and bytes per rank against density, a line per scheme.")
@scheme_options(bench_schemes())
@cuda_aware_option
@progress_options
def bench_exchange(nprocs, timeout, model, schemes, densities, iters, warmup, seed, no_memory, check_collectives,
                   servers, json_path, csv_path, plot_path, cuda_aware=None, hierarchical=False, progress_interval=10.0,
                   no_progress=False, **scheme_opts) -> None:
    """Time each scheme's exchange alone (indices + values, or push + pull) against density, at this W.

    The scheme runs its steps on bench-step gradients; only the phases that
    move data between ranks and the bytes are reported.  Sweep W with
    `bench scaling`, or run this under several -n.
    """
    output.configure_progress(progress_interval, not no_progress)
    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    servers_n = usage(check_servers, schemes, servers)
    cfgs = [validated(BenchConfig(model=model, scheme=s, density=d, iters=iters, warmup=warmup, seed=seed,
                                  memory=not no_memory, scheme_options=dict(per_scheme[s]), servers=servers_n,
                                  check_collectives=check_collectives, hierarchical=hierarchical, cuda_aware=cuda_aware),
                      nprocs)
            for s in schemes for d in densities]
    per_scheme = {c.scheme: c.scheme_options for c in cfgs}
    check_plot(plot_path)
    maybe_relaunch(nprocs, timeout)

    from ..bench.exchange import run_exchange_bench

    comm = open_comm(nprocs, check=cfgs[0].check_collectives, cuda_aware=cfgs[0].cuda_aware, configs=cfgs,
                     hierarchical=cfgs[0].hierarchical, gpu=cfgs[0].device == "cuda")
    progress = output.progress(comm, "exchange")
    results = run_exchange_bench(
        comm, model=model, schemes=schemes, densities=densities, iters=iters, warmup=warmup, seed=seed,
        memory=not no_memory, scheme_options=per_scheme, servers=servers_n,
        progress=None if progress is None else (lambda label, i, n: progress(i, n)))
    if comm.rank == 0:
        output.exchange_outputs(results, json_path, csv_path, plot_path)


# --------------------------------------------------------------------------- model
@bench.command("model")
@click.option("--model", type=click.Choice(model_names()), default="resnet50", show_default=True,
              help="Gradient vector of this model's size.")
@click.option("--densities", default="0.01,0.001", show_default=True, callback=density_list, metavar="D[,D...]",
              help="Densities to predict.")
@click.option("--worlds", default="2,4,8,16,32,64,128,256,512,1024", show_default=True, callback=int_list,
              metavar="W[,W...]", help="World sizes (one rank per host).")
@click.option("--rate", default="1gbit", show_default=True, help="Each host's link, each way (e.g. 10gbit).")
@click.option("--latency-us", type=click.FloatRange(min=0), default=50.0, show_default=True,
              help="Latency of one message over the link, microseconds.")
@click.option("--exchange", "exchange_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Fit latency and bandwidth to the topk results of this `bench exchange --json` file instead "
                   "of --rate/--latency-us.")
@click.option("--shared-cores", type=click.IntRange(min=1), default=None,
              help="The --measured steps ran with every rank on these few cores (the emulated cluster: this "
                   "machine's cores): their predictions use kernel rates timed in min(W, cores) processes at "
                   "once and stretch compute by W / cores.")
@click.option("--measured", multiple=True, type=click.Path(exists=True),
              help="`bench step --json` results to validate against (a file or a directory of them; repeatable): "
                   "predicted vs measured at their scheme, density and W.")
@output_options("Predictions, link, rates and validation as JSON.",
                "One row per scheme, density and W: predicted ms per phase.",
                "PNG: predicted step time against W (log-log), measured points on top.")
def bench_model(model, densities, worlds, rate, latency_us, exchange_json, shared_cores, measured, json_path,
                csv_path, plot_path) -> None:
    """Predict each scheme's step time for W up to 1,024 from the link and this machine's kernel rates."""
    import csv
    import json
    from pathlib import Path

    from ..bench import costmodel as cm
    from ..bench import model as bm

    link = usage(bm.link_from_exchange, exchange_json) if exchange_json else \
        cm.Link(latency=latency_us * 1e-6, bandwidth=usage(cm.parse_rate, rate))
    check_plot(plot_path)
    grads = {"grad": bm.model_gradient(model), "other": bm.model_gradient(model, rank=1)}
    res = bm.run_model(model=model, densities=densities, worlds=worlds, link=link,
                       rates=cm.measure_rates(**grads), shared_cores=shared_cores,
                       measured=bm.load_measured(measured),
                       rates_at=lambda p: cm.measure_rates(processes=p, repeats=3, **grads))
    click.echo(bm.format_model(res))
    if json_path:
        from ..results.provenance import local_provenance

        Path(json_path).write_text(json.dumps({**res, "provenance": local_provenance()}, indent=1))
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["scheme", "density", "world_size", "compensate_ms", "select_ms", "exchange_ms", "update_ms",
                        "step_ms"])
            for p in res["predictions"]:
                ph = p["phases"]
                w.writerow([p["scheme"], p["density"], p["world_size"]]
                           + [f"{ph[k] * 1e3:.4f}" for k in ("compensate", "select", "exchange", "update")]
                           + [f"{p['step_seconds'] * 1e3:.4f}"])
    if plot_path:
        bm.plot_model(res, plot_path)


# --------------------------------------------------------------------------- select
@bench.command("select")
@click.option("--mode", type=click.Choice(["kernels", "deft"]), default="kernels", show_default=True,
              help="kernels: top-k/threshold kernels vs torch.topk and one pass; "
                   "deft: DEFT's per-rank selection time vs whole-vector top-k for several W.")
@click.option("--size", type=click.IntRange(min=1), default=25_000_000, show_default=True,
              help="kernels: elements in the float32 vector.")
@click.option("--model", "models", type=click.Choice(model_names()), multiple=True,
              default=("resnet50", "lstm-wt2"), show_default=True, help="deft: gradient shapes.")
@click.option("--worlds", default="1,2,4,8,16", show_default=True, callback=int_list,
              help="deft: world sizes; each rank's share is timed one after another in this process.")
@click.option("--density", type=float, default=None,
              help="Fraction selected, in (0, 1] [default: 0.001 for kernels, 0.01 for deft].")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls of each kernel (best and median reported).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch intra-op threads (NumPy kernels are single-threaded).")
@click.option("--distribution", type=click.Choice(["normal", "student-t"]), default="normal",
              show_default=True, help="Distribution of the vector's values.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Write the result object to this file (a list for a sweep).")
@click.option("--sizes", default=None, callback=size_list, metavar="N[,N...]",
              help="kernels: sweep these vector sizes (replaces --size).")
@click.option("--densities", default=None, callback=density_list, metavar="D[,D...]",
              help="kernels: sweep these densities (replaces --density).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="One row per point (kernels) or per model and W (deft).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="PNG: kernel time vs size/density (kernels), or selection speedup vs W (deft).")
@click.option("--backend", type=click.Choice(["numpy", "cupy"]), default="numpy", show_default=True,
              help="numpy: the CPU kernels; cupy: the GPU kernels on the current device (with the device's "
                   "measured copy bandwidth and torch.topk on the same device).")
@click.option("--select-kernel", type=click.Choice(["native", "torch", "sort"]), default="native",
              show_default=True,
              help="deft (numpy): the selection primitive of both sides: this toolkit's kernels, torch.topk "
                   "(the DEFT reference's: whole vector for top-k, one call per layer for DEFT) or "
                   "copy-and-sort.")
def bench_select(mode, size, models, worlds, density, repeats, threads, distribution, seed, json_path,
                 sizes, densities, csv_path, plot_path, backend, select_kernel) -> None:
    """Time selection (one process): the kernels, or DEFT's per-rank share against whole-vector top-k.

    With several --sizes or --densities the kernels run once per point and
    one table (and --csv/--plot) covers the sweep.
    """
    if density is not None:
        density = usage(validate_density, density)
    check_plot(plot_path)
    size = sizes[0] if sizes else size
    density = densities[0] if densities else density
    if mode == "kernels" and (len(sizes or ()) > 1 or len(densities or ()) > 1):
        from ..bench.select_sweep import select_sweep_command

        try:
            select_sweep_command(backend, sizes or [size], densities or [0.001 if density is None else density],
                                 repeats=repeats, seed=seed, threads=threads, distribution=distribution,
                                 json_path=json_path, csv_path=csv_path, plot_path=plot_path, echo=click.echo)
        except RuntimeError as e:
            raise click.UsageError(str(e)) from None
        return
    if backend == "cupy":
        from ..backend.cupy_launch import available

        if not available():
            raise click.UsageError("--backend cupy: no GPU/CuPy available (needs CuPy, e.g. "
                                   "pip install cupy-cuda12x, and a CUDA device)")
        from ..bench import select_gpu

        if mode == "deft":
            rows = select_gpu.run_deft_select_bench_gpu(models=tuple(models), worlds=tuple(worlds),
                                                        density=0.01 if density is None else density, seed=seed,
                                                        repeats=repeats)
            click.echo(select_gpu.format_deft_select_bench_gpu(rows))
            output.select_outputs(mode, rows, json_path, csv_path, plot_path)
            return
        res = select_gpu.run_select_bench_gpu(n=size, density=0.001 if density is None else density,
                                              repeats=repeats, seed=seed, distribution=distribution)
        click.echo(select_gpu.format_select_bench_gpu(res))
        output.select_outputs(mode, [res], json_path, csv_path, plot_path)
        return
    if select_kernel != "native" and (mode != "deft" or backend != "numpy"):
        raise click.UsageError(f"--select-kernel {select_kernel} applies to --mode deft --backend numpy only")
    if mode == "deft":
        from ..bench.select_deft import format_deft_select_bench, run_deft_select_bench

        rows = usage(run_deft_select_bench, models=tuple(models), worlds=tuple(worlds),
                     density=0.01 if density is None else density, seed=seed, repeats=repeats,
                     kernel=select_kernel, threads=threads)
        click.echo(format_deft_select_bench(rows))
        output.select_outputs(mode, rows, json_path, csv_path, plot_path)
        return
    density = 0.001 if density is None else density
    from ..bench.select import format_select_bench, run_select_bench

    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.UsageError("bench select compares with torch.topk: install torch (pip install '.[train]')")
    res = run_select_bench(n=size, density=density, repeats=repeats, seed=seed, threads=threads,
                           distribution=distribution)
    click.echo(format_select_bench(res))
    output.select_outputs(mode, [res], json_path, csv_path, plot_path)


# --------------------------------------------------------------------------- scaling
@bench.command("scaling", cls=SectionedCommand)
@click.option("--worlds", default="1,2,4", show_default=True, callback=int_list, metavar="W[,W...]",
              help="World sizes: one `mpiexec -n W` job per W (and density and model).")
@click.option("--densities", default="0.01,0.001", show_default=True, callback=density_list,
              metavar="D[,D...]", help="Densities.")
@click.option("--model", "models", type=click.Choice(model_names()), multiple=True, default=("resnet50",),
              show_default=True, help="Gradient shapes; repeat for several.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("topk", "cltk", "deft"), show_default=True,
              help="Schemes; repeat for several (the baseline, dense or plumpdp, is added).")
@click.option("--no-baseline", is_flag=True, help="Do not add dense/plumpdp to each job (no speedup column).")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps per job.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-memory", is_flag=True, help="Disable error feedback.")
@click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
              help="Parameter-server schemes: the last S ranks of each job serve [1].")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True, metavar="SECONDS",
              help="Bound each job (MPIEXEC_TIMEOUT), and the subprocess 60 s later.")
@click.option("--emucluster", "emucluster_rate", default=None, metavar="RATE",
              help="Run each job on an emulated cluster of W hosts linked at RATE (e.g. 1gbit; bin/emucluster, "
                   "needs root).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, callback=writable_dir,
              metavar="DIR", help="Keep each job's JSON here [mpisparse-results/scaling-<UTC time> in the working "
                                  "directory].")
@click.option("--verbose", is_flag=True, help="Show each job's own output.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Every job's per-run result objects (a list), with baseline and speedup added.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="One row per model, scheme, W and density.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="PNG: step time, speedup and bytes per rank against W.")
@progress_options
@scheme_options(bench_schemes())
def bench_scaling(worlds, densities, models, schemes, no_baseline, iters, warmup, seed, no_memory, servers,
                  timeout, emucluster_rate, out_dir, verbose, json_path, csv_path, plot_path, progress_interval=10.0,
                  no_progress=False, **scheme_opts) -> None:
    """Sweep W and density: runs `mpisparse bench step -n W` per point, then one table and one plot.

    Not an MPI job itself: run it as a plain command (in a SLURM batch
    script too); each point is its own mpiexec job, bounded by --timeout.
    """
    from ..bench.runs import RunFailed, emucluster_status, scheme_option_args
    from ..bench.scaling import plan_scaling, run_scaling
    from ..mpi.launch import under_mpi_launcher

    if under_mpi_launcher():
        raise click.UsageError("bench scaling starts its own mpiexec jobs: run it as a plain command, "
                               "not under mpiexec/srun")
    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    for m in models:  # each point's job checks its W; only the options given are passed on
        for s in schemes:
            for d in densities:
                validated(BenchConfig(model=m, scheme=s, density=d, iters=iters, warmup=warmup, seed=seed,
                                      memory=not no_memory, scheme_options=dict(per_scheme[s]),
                                      servers=servers or 1), None)
    check_plot(plot_path)
    if emucluster_rate:
        ok, why = emucluster_status()
        if not ok:
            raise click.UsageError(f"--emucluster: {why}")
    given = {k: v for k, v in scheme_opts.items() if v is not None}
    extra = scheme_option_args({"given": given}) + (["--no-memory"] if no_memory else [])
    # each job prints a status line every interval; the driver passes them on while the job runs
    extra += ["--no-progress"] if no_progress else ["--progress-interval", f"{progress_interval:g}"]
    if out_dir is None:  # kept: the command lines printed name files that exist afterwards
        out_dir = out_dir_or_default(None, "scaling")
    points = plan_scaling(models=models, schemes=schemes, worlds=worlds, densities=densities, iters=iters,
                          warmup=warmup, seed=seed, servers=servers, extra_options=extra, out_dir=out_dir,
                          baseline=not no_baseline, emucluster_rate=emucluster_rate)
    if not points:
        raise click.UsageError("no point to run: every scheme needs more ranks than --worlds offers")
    try:
        results = run_scaling(points, timeout=timeout, echo=click.echo, stream=verbose,
                              progress=None if no_progress else (lambda line: click.echo(line, err=True)))
    except RunFailed as e:
        raise click.ClickException(f"{e} (the finished jobs' JSON is in {out_dir})") from None
    output.scaling_outputs(results, json_path, csv_path, plot_path, out_dir=out_dir)


from .bench_tta import bench_tta  # noqa: E402 - bench_tta's module imports this one's siblings only

bench.add_command(bench_tta)
