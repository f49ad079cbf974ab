"""The subcommands' name for :func:`tilegemm.console.console` (the one rich console)."""

from tilegemm.console import console

__all__ = ["console"]
