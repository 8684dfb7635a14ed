"""A hook that runs a callback once a module is imported, whoever imports it: the torch hooks are
installed right after the script imports torch (bootstrap.py), the pipeline's after it imports
torch.distributed.pipelining (torch_hooks.py); a script that never does pays nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once ``name`` has been imported, whoever imports it."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once; and the search below must not find us again
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module
        callback = self._callback

        def exec_then_hook(module: ModuleType) -> None:
            run_module(module)
            callback(module)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec
