"""The one dispatch point: which runtime runs a scheme, its checks and its drivers.

Three runtimes run schemes: ``collective`` (data parallel: every rank
steps the same way, :mod:`mpisparse.schemes`), ``ps`` (parameter server,
:mod:`mpisparse.ps`) and ``mp`` (pipeline model parallel, :mod:`mpisparse.mp`).
A scheme's base class declares its runtime (``SchemeBase.runtime``); a
training run with pipeline stages (``TrainConfig.mp``) runs in ``mp``
whatever its scheme.  Front ends call the functions here (:func:`validate`
first) and never look at a scheme's runtime themselves; this is the only
module that compares runtime names.  Drivers and checks are named as
``"module:function"`` and imported when called (torch is only needed to
train), so this module imports only the configuration and the registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .config import BenchConfig, TrainConfig
from .registry import SCHEMES, scheme_class

__all__ = ["RUNTIMES", "Runtime", "bench_schemes", "bench_step", "check_bench", "check_servers", "check_torchrun", "check_train", "runtime_of",
           "schemes_of", "train", "train_runtime", "validate"]


@dataclass(frozen=True)
class Runtime:
    """A runtime's drivers and checks, as ``"module:function"`` (None: the runtime has none).

    ``check`` is called as ``check(cfg, world)`` with a validated
    :class:`~mpisparse.config.TrainConfig` or :class:`~mpisparse.config.BenchConfig`
    and the world size (None when not known yet); it raises ValueError
    (one line naming the value) for what only this runtime rejects.
    """

    name: str
    train_driver: str
    bench_driver: str | None
    bench_refusal: str = ""
    check: str | None = None
    #: the scheme a sparse scheme of this runtime is compared with (``bench scaling``'s speedup column)
    baseline: str | None = None
    #: why this runtime refuses ``--device cuda`` (empty: it runs on the device)
    device_refusal: str = ""
    #: why this runtime cannot run over torch.distributed under torchrun (empty: it can)
    torchrun_refusal: str = "needs MPI's point-to-point messages"

    def driver(self, spec: str) -> Callable[..., Any]:
        module, func = spec.split(":")
        return getattr(importlib.import_module(module), func)

    def schemes(self) -> list[str]:
        """The registered schemes of this runtime, sorted."""
        return sorted(n for n, cls in SCHEMES.items() if cls.runtime == self.name)

    def refuse_bench(self, scheme: str) -> None:
        """ValueError when ``bench`` cannot run ``scheme`` (this runtime has no bench driver)."""
        if self.bench_driver is None:
            raise ValueError(f"scheme {scheme!r} " + self.bench_refusal.format(scheme=scheme))

    def check_config(self, cfg, world: int | None = None) -> None:
        self.check_device(cfg)
        if self.check is not None:
            self.driver(self.check)(cfg, world)


    def check_device(self, cfg) -> None:
        """ValueError (one line) when ``cfg.device`` asks for a GPU this runtime does not run on."""
        device = getattr(cfg, "device", "cpu")
        if device != "cpu" and self.device_refusal:
            raise ValueError(f"--device {device}: {self.device_refusal.format(scheme=cfg.scheme)}; "
                             "use --device cpu")


RUNTIMES: dict[str, Runtime] = {
    "collective": Runtime("collective", "mpisparse.train.loop:run_training", "mpisparse.bench.step:run_step_bench",
                          baseline="dense", torchrun_refusal=""),
    "ps": Runtime("ps", "mpisparse.ps.train:run_ps_training", "mpisparse.ps.bench:run_ps_step_bench",
                  check="mpisparse.ps.options:check_config", baseline="plumpdp",
                  device_refusal="the parameter-server runtime (scheme {scheme}) keeps the servers' shards and "
                                 "the workers' state in host memory"),
    "mp": Runtime("mp", "mpisparse.mp.runtime:run_mp_training", None,
                  "sparsifies activations between pipeline stages, not gradients: run it with "
                  "`mpisparse train --scheme {scheme} --mp-stages S`",
                  check="mpisparse.mp.config:check_config",
                  device_refusal="the pipeline runtime (--mp-stages) runs its stages and the activation "
                                 "exchange on the CPU"),
}


def runtime_of(scheme: str) -> Runtime:
    """The runtime that runs ``scheme`` (ValueError for an unknown name)."""
    return RUNTIMES[scheme_class(scheme).runtime]


def schemes_of(runtime: str) -> list[str]:
    """The registered schemes of runtime ``runtime`` (``collective``, ``ps`` or ``mp``), sorted."""
    return RUNTIMES[runtime].schemes()


def bench_schemes() -> list[str]:
    """The registered schemes ``bench`` runs (those of the runtimes with a bench driver, but a scheme that
    averages parameters, ``local_update``: no gradient bench has parameters), sorted."""
    return sorted(name for rt in RUNTIMES.values() if rt.bench_driver is not None for name in rt.schemes()
                  if not getattr(SCHEMES[name], "local_update", False))


def train_runtime(cfg: TrainConfig) -> Runtime:
    """The runtime that trains ``cfg``: ``mp`` with pipeline stages, else its scheme's."""
    return RUNTIMES["mp"] if cfg.mp is not None else runtime_of(cfg.scheme)


def validate(cfg: TrainConfig | BenchConfig, world: int | None = None) -> TrainConfig | BenchConfig:
    """``cfg.validate(world)``, then its runtime's own checks; returns ``cfg`` (ValueError, one line, if invalid).

    The configuration checks what holds for every scheme; the checks that
    depend on the runtime live here, so :mod:`mpisparse.config` needs no runtime.
    """
    cfg.validate(world)
    (check_bench if isinstance(cfg, BenchConfig) else check_train)(cfg, world)
    return cfg


def _check_trace(cfg: TrainConfig | BenchConfig) -> None:
    if cfg.trace is not None and runtime_of(cfg.scheme).name != "collective":
        raise ValueError(f"--trace applies to the data-parallel schemes ({', '.join(schemes_of('collective'))});"
                         f" scheme {cfg.scheme!r} is not one")


def check_train(cfg: TrainConfig, world: int | None = None) -> None:
    """The runtime's own checks of a validated training configuration (:func:`validate` calls it)."""
    _check_trace(cfg)
    train_runtime(cfg).check_config(cfg, world)


def check_torchrun(cfg: TrainConfig) -> None:
    """ValueError (one line) when ``cfg`` cannot train over torch.distributed (``train`` under torchrun)."""
    rt = train_runtime(cfg)
    if rt.torchrun_refusal:
        what = "--mp-stages" if cfg.mp is not None else f"--scheme {cfg.scheme}"
        raise ValueError(f"{what} {rt.torchrun_refusal} (runtime {rt.name}); under torchrun: the data-parallel "
                         f"schemes ({', '.join(RUNTIMES['collective'].schemes())})")


def check_bench(cfg: BenchConfig, world: int | None = None) -> None:
    """The runtime's own checks of a validated ``bench`` configuration (:func:`validate` calls it)."""
    _check_trace(cfg)
    rt = runtime_of(cfg.scheme)
    rt.refuse_bench(cfg.scheme)
    if getattr(scheme_class(cfg.scheme), "local_update", False):
        raise ValueError(f"scheme {cfg.scheme!r} {scheme_class(cfg.scheme).local_refusal}; bench step, exchange "
                         "and scaling time gradients only")
    if cfg.separate_wait and (cfg.hierarchical or rt.name != "collective"):
        raise ValueError(f"--separate-wait times the wait before flat collectives: it applies to the "
                         f"data-parallel schemes without --hierarchical, not to {cfg.scheme!r}"
                         + (" with --hierarchical" if cfg.hierarchical else f" ({rt.name} runtime)"))
    if cfg.output != "own" and rt.name != "collective":
        raise ValueError(f"--output {cfg.output} applies to the data-parallel schemes, not to {cfg.scheme!r} "
                         f"({rt.name} runtime)")
    if cfg.floor and rt.name != "collective":
        raise ValueError(f"--floor applies to the data-parallel schemes, not to {cfg.scheme!r} ({rt.name} runtime)")
    rt.check_config(cfg, world)


def check_servers(schemes: Sequence[str], servers: int | None) -> int:
    """``--servers`` on a command running ``schemes``: the number of servers (1 when not given).

    ValueError when it is given but no chosen scheme is a parameter-server scheme.
    """
    ps = schemes_of("ps")
    if servers is not None and not any(s in ps for s in schemes):
        raise ValueError(f"--servers applies to the parameter-server schemes ({', '.join(ps)}), "
                         f"not to {', '.join(schemes)}")
    return 1 if servers is None else int(servers)


def train(comm, cfg: TrainConfig, **hooks: Any):
    """Run one training configuration on every rank of ``comm``; returns its result."""
    rt = train_runtime(cfg)
    return rt.driver(rt.train_driver)(comm, cfg, **hooks)


def bench_step(comm, cfg: BenchConfig, **hooks: Any):
    """Run one ``bench step`` configuration on every rank of ``comm``; returns its result."""
    rt = runtime_of(cfg.scheme)
    rt.refuse_bench(cfg.scheme)
    return rt.driver(rt.bench_driver)(comm, cfg, **hooks)
