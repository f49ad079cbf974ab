"""Rungs, one module each; discovered by tilegemm.registry."""
