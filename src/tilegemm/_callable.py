"""Modules that are also functions: ``tilegemm.kernels`` and ``tilegemm.reference``.

Each name is both a module (the package of rungs; the float64 reference and its tolerance)
and a public function (the registered rungs; the float64 product). A function bound over
the module's name on the parent package hides the module from attribute access, so
``import tilegemm.kernels.cpu.k01_triple_loop as k`` failed ("cannot import name 'cpu' from
'kernels'") and ``tilegemm.kernels.cpu`` raised AttributeError even once imported. Here the
module stays the attribute, and calling it calls the function.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class CallableModule(types.ModuleType):
    """A module whose call is the function ``__call_target__`` names ("module:function"),
    imported on the first call (the rungs' package is imported before the API module)."""

    __call_target__: str

    def _target(self) -> Any:
        where, name = self.__call_target__.split(":")
        return getattr(importlib.import_module(where), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # what help() and inspect.signature show for a call
        import inspect

        return inspect.signature(self._target())


def make_callable(module_name: str, target: str) -> None:
    """Make the imported module ``module_name`` callable as ``target`` ("module:function")."""
    module = sys.modules[module_name]
    module.__call_target__ = target
    module.__class__ = CallableModule
