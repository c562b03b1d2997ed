"""The parameter-server runtime's checks of a configuration, before MPI starts (``train``, ``bench``)."""

from __future__ import annotations

from typing import Any

from ..registry import scheme_class
from .roles import Roles
from .scheme import PSScheme

__all__ = ["check_config"]


def check_config(cfg: Any, world: int | None = None) -> None:
    """What only this runtime rejects in a ``TrainConfig``/``BenchConfig`` of a parameter-server scheme.

    ``cfg``'s fields are already valid one by one.  Raises ValueError (one
    sentence naming the values): cross-option conflicts (``--core`` above
    ``--density``), a world without a worker.
    """
    cls = scheme_class(cfg.scheme)
    if not issubclass(cls, PSScheme):
        raise ValueError(f"scheme {cfg.scheme!r} is not a parameter-server scheme")
    cls.check_config(cfg.density, cfg.scheme_options)
    if world is not None:
        Roles(world, int(cfg.servers))

