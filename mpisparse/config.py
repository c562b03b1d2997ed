"""The typed configuration of a run, shared by every rank.

A front end (the CLI, or a library caller) builds one of these per scheme
it runs; the runtimes read them and nothing else.  ``TrainConfig`` is what
``mpisparse train`` runs, ``BenchConfig`` what ``mpisparse bench step``
runs, ``MPConfig`` the pipeline part of a model-parallel training run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BenchConfig", "MPConfig", "TrainConfig"]


@dataclass
class MPConfig:
    """``--mp-stages``, ``--split-after``, ``--micro-batches`` and the data-parallel scheme inside stages.

    ``dp_density`` None means ``--density``.  ``dp_options`` are the
    data-parallel scheme's own options (e.g. ``lifespan`` for ``dct``).
    """

    stages: int = 2
    split_after: list[str] = field(default_factory=list)
    micro_batches: int = 1
    dp_scheme: str = "dense"
    dp_density: float | None = None
    dp_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    """One training run of one scheme (``mpisparse train``)."""

    model: str = "mlp"
    data: str = "digits"
    data_dir: str | None = None
    scheme: str = "dense"
    density: float = 0.01
    epochs: int = 20
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    bptt: int = 35
    clip: float = 0.0
    seed: int = 0
    memory: bool = True
    checkpoint: str | None = None
    resume: bool = False
    scheme_options: dict[str, Any] = field(default_factory=dict)
    #: per-step ``Scheme.diagnostics()`` into the result (``--diagnostics``; extra communication, untimed)
    diagnostics: bool = False
    #: parameter-server schemes: the last ``servers`` ranks serve
    servers: int = 1
    #: a pipeline (model-parallel) run; None for data-parallel and parameter-server runs
    mp: MPConfig | None = None


@dataclass
class BenchConfig:
    """One ``mpisparse bench step`` run of one scheme on model-shaped synthetic gradients."""

    model: str = "resnet18"
    scheme: str = "dense"
    density: float = 0.01
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    memory: bool = True
    scheme_options: dict[str, Any] = field(default_factory=dict)
    diagnostics: bool = False
    #: parameter-server schemes: the last ``servers`` ranks serve
    servers: int = 1
