"""The registered parameter-server schemes (runtime ``ps``): ``plumpdp``, ``slimdp``, ``asgd``, ``dgs``.

Each class declares the name, the options and the mode, and names its
algorithm's worker and server sides (one module per algorithm in this
package).  :mod:`mpisparse.registry` imports this module to register them.
"""

from ..registry import SchemeOption, register
from .asgd import ASGDServer, ASGDWorker
from .dgs import DGSServer, DGSWorker
from .plumpdp import PlumpDPServer, PlumpDPWorker
from .scheme import ASYNC_MOMENTUM, LOCAL_STEPS, ROUND_ROBIN, SHARD_BY_LAYER, PSScheme
from .slimdp import DEFAULT_CORE_EVERY, SlimDPServer, SlimDPWorker

__all__ = ["ASGD", "DGS", "PlumpDP", "SlimDP"]


@register("plumpdp")
class PlumpDP(PSScheme):
    """Plump-DP, the standard parameter-server data parallelism (Sun et al., Sec. 2.1).

    Dense push of the accumulated local update, pull of the whole model,
    synchronous rounds (``--density`` is not used: everything is sent).
    """

    options = (LOCAL_STEPS, SHARD_BY_LAYER)
    mode = "sync"
    worker_class = PlumpDPWorker
    server_class = PlumpDPServer


@register("slimdp")
class SlimDP(PSScheme):
    """Slim-DP, core + explorer communication sets (Sun et al., Algorithm 1), synchronous.

    ``--density`` is alpha (the communication set's fraction), ``--core`` beta.
    """

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


@register("asgd")
class ASGD(PSScheme):
    """Dense asynchronous SGD on a parameter server (the DGS paper's baseline).

    ``--density`` is not used; ``--worker-density d < 1`` turns it into
    gradient dropping (GD-async).
    """

    options = (
        SchemeOption("worker_density", float, 1.0,
                     "asgd: fraction of each layer a worker pushes (gradient dropping with a residual; "
                     "1 = dense ASGD)", low=0.0, high=1.0, low_open=True),
        ASYNC_MOMENTUM,
        ROUND_ROBIN,
        SHARD_BY_LAYER,
    )
    mode = "async"
    uses_memory = True
    worker_class = ASGDWorker
    server_class = ASGDServer


@register("dgs")
class DGS(PSScheme):
    """Dual-Way Gradient Sparsification with SAMomentum (Yan et al.), asynchronous.

    ``--density`` is R, the fraction of each layer a worker pushes;
    ``--server-density`` the secondary compression of the downlink.
    """

    options = (
        SchemeOption("server_density", float, None,
                     "dgs: secondary compression, the fraction of each layer of G_k = M - v_k the server sends "
                     "(default: no compression)", low=0.0, high=1.0, low_open=True),
        SchemeOption("sam_momentum", float, None,
                     "dgs: m of SAMomentum, in [0, 1) (default: train's --momentum; 0.9 in bench step)",
                     low=0.0, high=1.0),
        ASYNC_MOMENTUM,
        ROUND_ROBIN,
        SHARD_BY_LAYER,
    )
    mode = "async"
    uses_memory = True
    worker_class = DGSWorker
    server_class = DGSServer

    @classmethod
    def check_config(cls, density, opts):
        m = opts.get("sam_momentum")
        if m is not None and m >= 1.0:
            raise ValueError(f"--sam-momentum is {m!r}; allowed range is [0, 1)")
