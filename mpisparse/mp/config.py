"""The pipeline / hybrid runtime's checks of its options, before MPI starts."""

from __future__ import annotations

from typing import Sequence

from ..config import MPConfig
from ..registry import SCHEMES
from ..runtimes import schemes_of
from .scheme import MPScheme

__all__ = ["MPConfig", "parse_split_after", "check_config", "check_mp_options", "DUMMY_INPUT"]

#: sample shapes of the built-in datasets ((features,), (C, H, W)), to check layer names before MPI
DUMMY_INPUT = {"digits": ((64,), (1, 8, 8)), "synthetic": ((64,), (1, 8, 8)),
               "cifar10": ((3 * 32 * 32,), (3, 32, 32))}


def parse_split_after(text: str | None) -> list[str]:
    """``"net.2,net.4"`` -> ``["net.2", "net.4"]`` (blanks dropped)."""
    if not text:
        return []
    names = [t.strip() for t in text.split(",")]
    if any(not t for t in names):
        raise ValueError(f"--split-after {text!r} has an empty layer name; give LAYER[,LAYER...]")
    return names


def check_mp_options(*, model: str, data: str, schemes: Sequence[str], stages: int, split_after: Sequence[str],
                     micro_batches: int, batch_size: int, dp_scheme: str | None, dp_density: float | None,
                     world: int | None = None, clip: float = 0.0) -> bool:
    """Validate the pipeline options before MPI starts; True when the run is a pipeline run.

    A pipeline run has ``--mp-stages`` >= 2 or a pipeline scheme (an :class:`MPScheme`).
    Raises ValueError (one sentence naming the values) otherwise wrong.
    """
    mp_schemes = [s for s in schemes if issubclass(SCHEMES[s], MPScheme)]
    if stages < 1:
        raise ValueError(f"--mp-stages is {stages}; it must be >= 1")
    if stages == 1 and not mp_schemes:
        given = [flag for flag, on in (("--split-after", bool(split_after)), ("--micro-batches", micro_batches != 1),
                                       ("--dp-scheme", dp_scheme is not None),
                                       ("--dp-density", dp_density is not None)) if on]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to pipeline runs: add --mp-stages S (S >= 2)")
        return False
    if stages < 2:
        raise ValueError(f"scheme {mp_schemes[0]!r} sparsifies activations between pipeline stages: "
                         f"it needs --mp-stages S with S >= 2, got {stages}")
    mp_names = ", ".join(sorted(n for n in SCHEMES if issubclass(SCHEMES[n], MPScheme)))
    for s in schemes:
        if not issubclass(SCHEMES[s], MPScheme) and s != "dense":
            raise ValueError(f"--scheme {s} is not a pipeline scheme: with --mp-stages, --scheme says how activations "
                             f"cross the stages (dense, or {mp_names}); pass {s} as --dp-scheme to run it inside "
                             f"each stage's data-parallel group")
    dp = dp_scheme or "dense"
    if dp not in schemes_of("collective"):
        raise ValueError(f"--dp-scheme {dp} is not a data-parallel (collective) scheme")
    if SCHEMES[dp].local_update:
        raise ValueError(f"--dp-scheme {dp} {SCHEMES[dp].local_refusal}; a stage's replicas exchange gradients only")
    if world is not None:
        if world % stages:
            raise ValueError(f"-n {world} is not divisible by --mp-stages {stages}: hybrid runs need "
                             f"W = replicas x stages")
        replicas = world // stages
        if replicas < SCHEMES[dp].min_world_size:
            raise ValueError(f"--dp-scheme {dp} needs at least {SCHEMES[dp].min_world_size} replicas per stage; "
                             f"-n {world} with --mp-stages {stages} gives {replicas}")
    if micro_batches < 1 or micro_batches > batch_size:
        raise ValueError(f"--micro-batches is {micro_batches}; allowed range is [1, --batch-size {batch_size}]")
    if clip > 0:
        raise ValueError("--clip is not supported with --mp-stages (the norm would span all stages)")

    from .stages import SPLITTABLE_MODELS, plan_stages

    if model not in SPLITTABLE_MODELS:
        raise ValueError(f"--model {model} cannot be split into pipeline stages; models that can: "
                         f"{', '.join(SPLITTABLE_MODELS)}")
    if data in DUMMY_INPUT:
        import torch

        from ..models.nets import build_model, needs_image

        shape = DUMMY_INPUT[data][1 if needs_image(model) else 0]
        with torch.random.fork_rng():
            net = build_model(model, input_shape=shape, num_classes=10)
        plan_stages(net, stages, list(split_after) or None)
    return True


def check_config(cfg, world: int | None = None) -> None:
    """This runtime's checks of a ``TrainConfig`` (its fields already valid one by one): :func:`check_mp_options`.

    ``cfg.mp`` None with a pipeline scheme is a run without stages (an
    error); ``cfg.mp`` with one stage is a pipeline option set on a run
    without stages (an error naming the options that differ from their
    defaults).
    """
    mp = cfg.mp
    if mp is None:
        stages, split_after, micro_batches, dp, dp_density = 1, [], 1, None, None
    else:
        stages, split_after, micro_batches, dp, dp_density = (mp.stages, mp.split_after, mp.micro_batches,
                                                               mp.dp_scheme, mp.dp_density)
        if stages == 1 and dp == "dense" and (split_after or micro_batches != 1 or dp_density is not None):
            dp = None  # the default: name only the options that were set
    check_mp_options(model=cfg.model, data=cfg.data, schemes=(cfg.scheme,), stages=stages, split_after=split_after,
                     micro_batches=micro_batches, batch_size=cfg.batch_size, dp_scheme=dp, dp_density=dp_density,
                     world=world, clip=cfg.clip)
