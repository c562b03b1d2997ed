"""The data-parallel schemes (runtime ``collective``): one module per scheme.

Each module registers its scheme with :func:`mpisparse.registry.register`
when imported; every module of this package is imported below, so adding a
data-parallel scheme is adding a file.  The registry itself
(:data:`SCHEMES`, :func:`create`, ...) is :mod:`mpisparse.registry`,
re-exported here; it holds the schemes of every runtime.
"""

import importlib
import pkgutil

from ..registry import SCHEMES, SchemeOption, all_options, create, k_for, register, scheme_class, validate_density
from .base import CollectiveScheme, Scheme

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["SCHEMES", "CollectiveScheme", "Scheme", "SchemeOption", "k_for", "register", "scheme_class",
           "validate_density", "create", "all_options"]
