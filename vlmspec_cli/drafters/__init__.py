"""Drafting methods, one file each, registered by name."""

from vlmspec_cli.drafters import chain, ensemble, hidden, none, tree, twig  # noqa: F401  (registration side effects)
from vlmspec_cli.drafters.base import Draft, Drafter, create_drafter, drafter_names, register

__all__ = ["Draft", "Drafter", "create_drafter", "drafter_names", "register"]
