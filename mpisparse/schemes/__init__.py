"""The scheme registry: importing this package registers every scheme.

``SCHEMES`` maps a ``--scheme`` name to its class; one module per scheme.
"""

from .base import SCHEMES, Scheme, SchemeOption, k_for, register, scheme_class, validate_density
from . import dense, randomk, threshold, topk  # noqa: F401  (register on import)

__all__ = ["SCHEMES", "Scheme", "SchemeOption", "k_for", "register", "scheme_class",
           "validate_density", "create", "all_options"]


def create(name: str, comm, layout, density: float, **kw) -> Scheme:
    """Instantiate scheme ``name``; invalid hyperparameters raise ValueError."""
    return scheme_class(name)(comm, layout, density, **kw)


def all_options() -> dict[str, tuple[SchemeOption, list[str]]]:
    """Every scheme option by name, with the schemes that declare it."""
    out: dict[str, tuple[SchemeOption, list[str]]] = {}
    for sname in sorted(SCHEMES):
        for opt in SCHEMES[sname].options:
            if opt.name in out:
                out[opt.name][1].append(sname)
            else:
                out[opt.name] = (opt, [sname])
    return out
