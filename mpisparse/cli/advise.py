"""``mpisparse advise`` (which scheme wins on this network; no MPI) and ``mpisparse advise-steps`` (every
scheme's real training step, measured under MPI, to check the advice against)."""

from __future__ import annotations

import click

from ..bench.advise import DENSE_EXCHANGES
from ..config import TRAIN_MODELS
from ..models.shapes import model_names
from .options import mpi_options, usage, writable_file
from .session import maybe_relaunch, open_comm

WIRES = ("float16", "bfloat16")
#: ``--intra-rate`` by ``--device``: NVLink 4's nominal 450 GB/s each way a GPU (H100, H200 SXM); what dense's
#: exchange carried over shared memory between 2 ranks on this 2-core machine (docs/advisor.md: 11.7-14.2 Gbit/s)
INTRA_DEFAULT = {"cuda": "3600gbit", "cpu": "12gbit"}


def _rate(ctx, param, value):
    from ..bench.costmodel import parse_rate

    try:
        rate = parse_rate(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if not rate > 0:
        raise click.BadParameter(f"link rate {value!r}; it must be > 0")
    return rate


def _rate_or_none(ctx, param, value):
    return None if value is None else _rate(ctx, param, value)


def _size(ctx, param, value):
    from ..bench.costmodel import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("advise")
@click.option("--model", type=click.Choice(sorted(set(model_names()) | set(TRAIN_MODELS))), default="resnet18",
              show_default=True,
              help="The gradient's size and layers (powersgd's factors) are this model's: a shape set of bench "
                   "step, or a net of train (mlp, cnn, lstm, gpt, dlrm: as advise-steps builds it).")
@click.option("--compute-seconds", type=click.FloatRange(min=0), default=None,
              help="A step's forward + backward + local optimizer step, seconds (per rank, as the ranks run). "
                   "Default: from --measured's compute way, else a short run of the model here.")
@click.option("--batch", type=click.IntRange(min=1), default=16, show_default=True,
              help="Samples per rank of the short run that measures the compute (no --compute-seconds).")
@click.option("--hidden-share", type=click.FloatRange(0, 1), default=0.35, show_default=True,
              help="Share of the exchange overlap hides (bench overlap's 'exchange hidden', or advise-steps').")
@click.option("--hidden-from", "hidden_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Take --hidden-share from this `advise-steps --json` (dense-16 against dense-opt).")
@click.option("--window", type=click.FloatRange(0, 1), default=2 / 3, show_default=True,
              help="Overlap hides at most this share of the compute (backward's).")
@click.option("-W", "--world", type=click.IntRange(min=1), default=2, show_default=True, help="Ranks.")
@click.option("--hosts", type=click.IntRange(min=1), default=None,
              help="Hosts, one NIC each [W / --ranks-per-host].")
@click.option("--ranks-per-host", type=click.IntRange(min=1), default=None,
              help="Consecutive ranks on each host (GPUs a node) [W / --hosts, else 1]: they share its NIC and "
                   "reach each other over --intra-rate.")
@click.option("--rate", default="1gbit", show_default=True, callback=_rate,
              help="Each host's NIC, each way, tc syntax (30mbit, 1gbit, 25gbit) or bytes per second.")
@click.option("--intra-rate", default=None, callback=_rate_or_none,
              help="Each rank's link to the other ranks of its host, each way (NVLink, PCIe, shared memory) "
                   f"[--device cuda: {INTRA_DEFAULT['cuda']}, NVLink 4's nominal 450 GB/s a GPU; cpu: "
                   f"{INTRA_DEFAULT['cpu']}, what shared memory carried here].")
@click.option("--intra-from", "intra_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--intra-rate is what dense's exchange really carried in this `bench exchange --json` run on "
                   "one host (--scheme dense --densities 1).")
@click.option("--intra-latency-us", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Latency of one message inside a host, microseconds.")
@click.option("--hierarchical", is_flag=True,
              help="The schemes exchange in two levels (within the host, across hosts, within the host; "
                   "mpisparse/mpi/hierarchy.py), those that can; the others (gtopk, oktopk) flat.")
@click.option("--dense-exchange", type=click.Choice(DENSE_EXCHANGES), default=None,
              help="The dense ways' exchange: mpi (this library's Allreduce, flat or two-level) or nccl (NCCL's: "
                   "reduce-scatter in the node, the shards across nodes, allgather in the node) [cuda: nccl; "
                   "cpu: mpi].")
@click.option("--link-from", "link_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The link's bandwidth is what dense's exchange really carried in this `bench exchange --json` "
                   "(--scheme dense --densities 1) file, not --rate.")
@click.option("--burst", default="0", show_default=True, callback=_size, metavar="SIZE",
              help="Each host's link is a token bucket of this size (tc syntax: 128kb): a step's first bytes up "
                   "to it cross at once, refilled while the ranks compute (bin/emucluster's links: 128kb).")
@click.option("--latency-us", type=click.FloatRange(min=0), default=50.0, show_default=True,
              help="Latency of one message over the link, microseconds.")
@click.option("--density", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True,
              help="Density of the sparse schemes.")
@click.option("--local-steps", type=click.IntRange(min=1), default=8, show_default=True,
              help="localsgd's period: the parameters averaged every this many steps (steps to target: --tta).")
@click.option("--dense-wire", type=click.Choice(WIRES), default="float16", show_default=True,
              help="The optimized dense baseline's wire dtype.")
@click.option("--sparse-wire", type=click.Choice(("float32",) + WIRES), default="float32", show_default=True,
              help="The sparse schemes' value dtype on the wire (gtopk: float32 always).")
@click.option("--shared-cores", type=click.IntRange(min=1), default=None,
              help="The ranks share this many cores (the emulated cluster): scheme compute is stretched by W / "
                   "cores.")
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True,
              help="Whose rates give the schemes' own compute: cpu (this 2-core machine's table) or cuda (an "
                   "NVIDIA H200's, from docs/results/gpu/); with --measure-rates, where to time the kernels.")
@click.option("--rates", "rates_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A rate table of your own (`advise --measure-rates FILE` on your machine) instead of "
                   "--device's.")
@click.option("--measure-rates", "measure_json", type=click.Path(dir_okay=False), default=None,
              callback=writable_file, metavar="FILE",
              help="Time the kernels here on --device (tens of seconds), write the rate table to FILE and use it.")
@click.option("--overhead-from", "overhead_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Each scheme's step overhead (library and scheme compute), measured by `advise-steps -n 1 "
                   "--json` as a share of the compute step, instead of the cost model's kernel rates.")
@click.option("--bytes-from", "bytes_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Each scheme's bytes per step as measured by `advise-steps --json` on the same W (any link), "
                   "instead of the byte model's: a scheme whose selected count drifts moves what it moved.")
@click.option("--tta", "tta_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="`bench tta --json`: each scheme's steps to target (without it: equal steps assumed).")
@click.option("--measured", "measured_json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="`advise-steps --json`: compare the predicted steps and winner with these measured ones.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="The advice (and validation) as JSON.")
def advise(model, compute_seconds, batch, hidden_share, hidden_json, window, world, hosts, ranks_per_host, rate,
           intra_rate, intra_json, intra_latency_us, hierarchical, dense_exchange, link_json, burst, latency_us,
           density, local_steps, dense_wire, sparse_wire, shared_cores, device, rates_json, measure_json, overhead_json,
           bytes_json, tta_json, measured_json, json_path) -> None:
    """Predict every scheme's step and time to target on this network, the winner, and the crossover link
    bandwidth above which optimized dense (16-bit wire, overlapped) wins."""
    from ..bench import advise as adv
    from ..bench import advise_measured as am
    from ..bench import costmodel as cm
    from ..bench import rates as rt
    from ..schemes.powersgd import powersgd_elements

    hosts = usage(hosts_of, world, hosts, ranks_per_host)
    if hidden_json:
        hidden_share = am.hidden_share_from(usage(am.load_steps, hidden_json))
    if link_json:
        rate = usage(am.delivered_bandwidth, link_json)
    if intra_json:
        intra_rate = usage(am.delivered_bandwidth, intra_json)
    intra_rate = intra_rate or cm.parse_rate(INTRA_DEFAULT[device])
    steps = usage(am.load_tta, tta_json) if tta_json else {}
    overheads = usage(am.overheads_from, overhead_json) if overhead_json else {}
    overhead_turns = usage(am.overhead_turns_from, overhead_json) if overhead_json else {}
    bytes_sent = usage(am.bytes_from, bytes_json, world) if bytes_json else {}
    measured = usage(am.load_steps, measured_json) if measured_json else None
    if measured is not None:
        usage(am.check_measured_matches, measured, world=world, hierarchical=hierarchical)
    table = usage(rt.load_table, rates_json) if rates_json else None
    if measure_json:
        from ..mpi.device import check_device_usable

        usage(check_device_usable, device, need_torch=False)
    compute_from = "given"
    if compute_seconds is None and measured is not None:
        compute_seconds, compute_from = am.paired_steps(measured)["compute"], "measured (--measured)"
    if compute_seconds is None and device == "cuda":
        raise click.UsageError(f"--device cuda: the compute step of {model} on your GPU is not measured here; give "
                               "--compute-seconds (one rank's forward + backward + optimizer step, seconds)")
    if compute_seconds is None:
        compute_seconds, compute_from = measure_compute(model, batch), f"measured here (batch {batch})"
    layout = _layout(model)
    if measure_json:
        table = measure_here(device, layout.n, world, shared_cores, measure_json)
    table = table or rt.builtin_table(device)
    setting = usage(adv.Setting, n=layout.n, compute=compute_seconds, world=world, hosts=hosts,
                    density=density, hidden_share=hidden_share, window=window, dense_wire=dense_wire,
                    sparse_wire=sparse_wire, latency=latency_us * 1e-6, rates=table.rates,
                    shared_cores=shared_cores, powersgd_elements=powersgd_elements(layout), steps=steps,
                    overheads=overheads, overhead_turns=overhead_turns, bytes_sent=bytes_sent, burst=burst,
                    intra=cm.Link(latency=intra_latency_us * 1e-6, bandwidth=intra_rate) if hosts < world else None,
                    hierarchical=hierarchical, dense_exchange=dense_exchange or ("nccl" if device == "cuda" else "mpi"),
                    step_fixed=table.step_fixed, local_steps=local_steps)
    res = adv.advise(setting, cm.Link(latency=latency_us * 1e-6, bandwidth=rate))
    res.update(model=model, compute_from=compute_from, hidden_from=hidden_json or "--hidden-share",
               overhead_from=overhead_json or f"the rate table: {table.name}", link_from=link_json or "--rate",
               bytes_from=bytes_json or "the cost model's byte model", device=device, rates_from=table.name,
               rates_about=table.about, intra_from=intra_json or ("--intra-rate" if hosts < world else None))
    click.echo(adv.format_advice(res))
    if measured is not None:
        res["validation"] = am.validate(res, measured)
        click.echo(am.format_validation(res["validation"]))
    if json_path:
        from ..results.files import write_json
        from ..results.provenance import local_provenance

        write_json(json_path, {**res, "provenance": local_provenance()})


def hosts_of(world: int, hosts: int | None, ranks_per_host: int | None) -> int:
    """Hosts of ``world`` ranks from ``--hosts`` and ``--ranks-per-host`` (either, or both when they agree; neither:
    one rank a host); ValueError (one line) when ``world`` is not a multiple or they disagree."""
    if ranks_per_host is not None:
        if world % ranks_per_host:
            raise ValueError(f"W = {world} with --ranks-per-host {ranks_per_host}; W must be a multiple of the "
                             "ranks per host")
        if hosts is not None and hosts * ranks_per_host != world:
            raise ValueError(f"--hosts {hosts} and --ranks-per-host {ranks_per_host} make {hosts * ranks_per_host} "
                             f"ranks, not W = {world}; give one of them")
        return world // ranks_per_host
    return world if hosts is None else hosts


def measure_here(device: str, n: int, world: int, shared_cores: int | None, path: str):
    """The rate table of this machine (:func:`mpisparse.bench.rates.measure_table`), written to ``path``."""
    import sys

    from ..bench import costmodel as cm
    from ..bench import rates as rt
    from ..results.provenance import local_provenance

    click.echo(f"timing the kernels on {device} at {n:,} elements ...", err=True)
    measured = {"command": "mpisparse " + " ".join(sys.argv[1:]), "provenance": local_provenance()}
    table = rt.measure_table(device, n, repeats=3, processes=cm.sharing(world, shared_cores)[0], measured=measured)
    rt.write_table(path, table)
    return rt.load_table(path)


def _layout(model: str):
    """The fusion layout of ``model``'s gradient: its layer shapes, or the CIFAR-shaped net's parameters."""
    from ..backend.fusion import FusionLayout
    from ..models.shapes import layer_shapes

    if model in model_names():
        return FusionLayout(layer_shapes(model))
    import torch

    from ..bench.overlap import INPUT_SHAPE
    from ..models.nets import bench_net

    net, _, _ = bench_net(model, 1, generator=torch.Generator(), input_shape=INPUT_SHAPE)
    return FusionLayout([(name, tuple(p.shape)) for name, p in net.named_parameters()])


def measure_compute(model: str, batch: int, steps: int = 3) -> float:
    """Median seconds of a local step (forward, backward, SGD) of the net on random data (CIFAR-shaped images;
    a language model: random tokens, :func:`mpisparse.models.nets.bench_net`)."""
    import statistics
    import time

    import torch

    from ..bench.overlap import INPUT_SHAPE
    from ..models.nets import bench_net

    if model not in TRAIN_MODELS:
        raise click.UsageError(f"measuring the compute of {model!r}: allowed {', '.join(TRAIN_MODELS)}; "
                               "or give --compute-seconds")
    torch.manual_seed(0)
    net, x, y = bench_net(model, batch, generator=torch.Generator().manual_seed(1), input_shape=INPUT_SHAPE)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@click.command("advise-steps")
@mpi_options
@click.option("--model", type=click.Choice(TRAIN_MODELS), default="resnet18", show_default=True,
              help="The net trained (random batches, each rank its own: CIFAR-shaped images; lstm, gpt: windows "
                   "of 64 random byte tokens).")
@click.option("--scheme", "schemes", multiple=True, default=("topk", "cltk", "deft", "gtopk", "powersgd", "oktopk"),
              show_default=True, type=click.Choice(["topk", "cltk", "deft", "gtopk", "powersgd", "oktopk"]),
              help="Sparse schemes measured beside compute, dense, dense-16 and dense-opt (repeatable).")
@click.option("--density", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True)
@click.option("--dense-wire", type=click.Choice(WIRES), default="float16", show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=16, show_default=True, help="Samples per rank.")
@click.option("--iters", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed turns per way (the ways take turns).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Untimed turns first.")
@click.option("--steps-per-turn", type=click.IntRange(min=1), default=1, show_default=True,
              help="Consecutive steps of a way in each turn; the mean of the last half is the turn's step (the "
                   "first settle a link's token bucket that refilled during the other ways' turns).")
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True,
              help="cuda: the nets, batches and exchanges on each rank's GPU (by local rank); needs CuPy and a CUDA "
                   "build of torch.")
@click.option("--hierarchical", is_flag=True,
              help="Two-level collectives (mpisparse/mpi/hierarchy.py; hosts by host name, or "
                   "MPISPARSE_RANKS_PER_HOST consecutive ranks): gtopk's and oktopk's exchanges stay flat.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="The measured steps (and provenance).")
def advise_steps(nprocs, timeout, model, schemes, density, dense_wire, batch, iters, warmup, steps_per_turn,
                 device, hierarchical, json_path) -> None:
    """Measure every scheme's training step (with compute) to check `mpisparse advise` against."""
    from ..mpi.device import check_device_usable

    usage(check_device_usable, device, need_torch=True)
    maybe_relaunch(nprocs, timeout)
    from ..bench.advise_steps import format_steps, run_steps
    from ..results.files import write_json
    from ..results.provenance import gather_provenance

    comm = open_comm(nprocs, hierarchical=hierarchical, gpu=device == "cuda")
    say = (lambda m: click.echo(m, err=True)) if comm.rank == 0 else None
    res = run_steps(comm, model=model, schemes=tuple(dict.fromkeys(schemes)), density=density, batch=batch,
                    iters=iters, warmup=warmup, dense_wire=dense_wire, steps_per_turn=steps_per_turn,
                    progress=say, device=device)
    prov = gather_provenance(comm)
    if comm.rank == 0:
        click.echo(format_steps(res))
        write_json(json_path, {**res, "provenance": prov})
