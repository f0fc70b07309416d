"""Sparsification methods, one module each.  Importing the package imports every
module in it, and each method's class registers itself by its ``name``
(``base.REGISTRY``)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
