"""``dgs``: Dual-Way Gradient Sparsification with SAMomentum (Yan et al.).

``--density`` is R, the fraction of each layer a worker pushes;
``--server-density`` the secondary compression of the downlink.  The
algorithm lives in :mod:`mpisparse.ps.dgs`.
"""

from ..ps.dgs import DGSServer, DGSWorker
from ..ps.scheme import ROUND_ROBIN, SHARD_BY_LAYER, PSScheme
from .base import SchemeOption, register


@register("dgs")
class DGS(PSScheme):
    """DGS (asynchronous)."""

    options = (
        SchemeOption("server_density", float, None,
                     "dgs: secondary compression, the fraction of each layer of G_k = M - v_k the server sends "
                     "(default: no compression)", low=0.0, high=1.0, low_open=True),
        SchemeOption("sam_momentum", float, None,
                     "dgs: m of SAMomentum, in [0, 1) (default: train's --momentum; 0.9 in bench step)",
                     low=0.0, high=1.0),
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
