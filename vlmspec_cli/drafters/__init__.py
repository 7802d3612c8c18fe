"""Drafting methods, one module each, registered by name (base.register). Every module of
the package is imported here, so a new method is one new file."""

import importlib
import pkgutil

from vlmspec_cli.drafters.base import (DraftingMethod, create_drafter, method_class, method_names,
                                       register)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DraftingMethod", "create_drafter", "method_class", "method_names", "register"]
