"""The one dispatch point: which runtime runs a scheme, and its drivers.

Three runtimes run schemes: ``collective`` (data parallel: every rank
steps the same way, :mod:`mpisparse.schemes`), ``ps`` (parameter server,
:mod:`mpisparse.ps`) and ``mp`` (pipeline model parallel, :mod:`mpisparse.mp`).
A scheme declares its runtime; a training run with pipeline stages
(``TrainConfig.mp``) runs in ``mp`` whatever its scheme.  Front ends call
:func:`train` and :func:`bench_step` and never look at a scheme's runtime
themselves.  Drivers are imported lazily (torch is only needed to train).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .config import BenchConfig, TrainConfig
from .schemes import scheme_class

__all__ = ["RUNTIMES", "Runtime", "bench_step", "runtime_of", "train"]


@dataclass(frozen=True)
class Runtime:
    """A runtime's drivers, as ``"module:function"`` (None: the runtime has no such command)."""

    name: str
    train_driver: str
    bench_driver: str | None
    bench_refusal: str = ""

    def driver(self, spec: str) -> Callable[..., Any]:
        module, func = spec.split(":")
        return getattr(importlib.import_module(module), func)


RUNTIMES: dict[str, Runtime] = {
    "collective": Runtime("collective", "mpisparse.train.loop:run_training", "mpisparse.bench.step:run_step_bench"),
    "ps": Runtime("ps", "mpisparse.ps.train:run_ps_training", "mpisparse.ps.bench:run_ps_step_bench"),
    "mp": Runtime("mp", "mpisparse.mp.runtime:run_mp_training", None,
                  "sparsifies activations between pipeline stages, not gradients: run it with "
                  "`mpisparse train --scheme {scheme} --mp-stages S`"),
}


def runtime_of(scheme: str) -> Runtime:
    """The runtime that runs ``scheme`` (ValueError for an unknown name)."""
    return RUNTIMES[scheme_class(scheme).family]


def train(comm, cfg: TrainConfig, **hooks: Any):
    """Run one training configuration on every rank of ``comm``; returns its result."""
    rt = RUNTIMES["mp"] if cfg.mp is not None else runtime_of(cfg.scheme)
    return rt.driver(rt.train_driver)(comm, cfg, **hooks)


def bench_step(comm, cfg: BenchConfig, **hooks: Any):
    """Run one ``bench step`` configuration on every rank of ``comm``; returns its result."""
    rt = runtime_of(cfg.scheme)
    if rt.bench_driver is None:
        raise ValueError(f"scheme {cfg.scheme!r} " + rt.bench_refusal.format(scheme=cfg.scheme))
    return rt.driver(rt.bench_driver)(comm, cfg, **hooks)
