"""Subcommands of the ``tilegemm`` CLI, one module each (discovered by tilegemm.cli)."""
