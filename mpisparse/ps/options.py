"""Checks of the parameter-server options before MPI starts (``train``, ``bench step``)."""

from __future__ import annotations

from typing import Any, Sequence

from ..schemes import SCHEMES
from .roles import Roles


def ps_schemes(schemes: Sequence[str]) -> list[str]:
    return [s for s in schemes if SCHEMES[s].family == "ps"]


def check_ps_options(schemes: Sequence[str], *, servers: int | None, world: int | None, density: float,
                     per_scheme: dict[str, dict[str, Any]], checkpoint: bool = False) -> int:
    """Validate ``--servers`` and the PS schemes' options; returns the number of servers.

    Raises ValueError (one sentence naming the values): ``--servers`` without
    a parameter-server scheme, a world without a worker, cross-option
    conflicts (``--core`` above ``--density``), checkpoints.
    """
    chosen = ps_schemes(schemes)
    if servers is not None and not chosen:
        names = ", ".join(sorted(n for n in SCHEMES if SCHEMES[n].family == "ps"))
        raise ValueError(f"--servers applies to the parameter-server schemes ({names}), "
                         f"not to {', '.join(schemes)}")
    n_servers = 1 if servers is None else int(servers)
    for s in chosen:
        SCHEMES[s].check_config(density, per_scheme.get(s, {}))
    if chosen and world is not None:
        Roles(world, n_servers)
    if chosen and checkpoint:
        raise ValueError(f"--checkpoint/--resume are not supported for the parameter-server scheme "
                         f"{chosen[0]!r}")
    return n_servers
