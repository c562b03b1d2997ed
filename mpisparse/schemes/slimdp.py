"""``slimdp``: Slim-DP, core + explorer communication sets (Sun et al., Algorithm 1).

``--density`` is alpha (the communication set's fraction), ``--core`` beta.
The algorithm lives in :mod:`mpisparse.ps.slimdp`.
"""

from ..ps.scheme import LOCAL_STEPS, SHARD_BY_LAYER, PSScheme
from ..ps.slimdp import DEFAULT_CORE_EVERY, SlimDPServer, SlimDPWorker
from .base import SchemeOption, register


@register("slimdp")
class SlimDP(PSScheme):
    """Slim-DP (synchronous)."""

    options = (
        SchemeOption("core", float, None,
                     "slimdp: beta, the core's fraction of the parameters, in [0, --density] "
                     "(default: --density / 2)", low=0.0, high=1.0),
        SchemeOption("core_every", int, DEFAULT_CORE_EVERY,
                     "slimdp: q, communications between two core re-selections by the server", low=1),
        SchemeOption("significance_c", float, None,
                     "slimdp: c in the significance |w| + c|g| (default: mean|w| / mean|g|, the same scale)",
                     low=0.0),
        LOCAL_STEPS,
        SHARD_BY_LAYER,
    )
    mode = "sync"
    worker_class = SlimDPWorker
    server_class = SlimDPServer

    @classmethod
    def check_config(cls, density, opts):
        beta = opts.get("core")
        if beta is not None and beta > density:
            raise ValueError(f"--core is {beta!r}; the core is part of the communication set, "
                             f"allowed range is [0, --density = {density!r}]")
