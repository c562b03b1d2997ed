"""The scheme registry: importing this package registers every scheme.

``SCHEMES`` maps a ``--scheme`` name to its class.  Each scheme is one module
of this package and registers itself with :func:`register` when imported;
every module here is imported below, so adding a scheme is adding a file.
"""

import importlib
import pkgutil

from .base import SCHEMES, Scheme, SchemeOption, k_for, register, scheme_class, validate_density

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

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
