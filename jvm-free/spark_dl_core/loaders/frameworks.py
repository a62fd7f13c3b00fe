"""Framework adapters register here; the dataset finds them by name.

The core never imports torch or tensorflow itself: ``Dataset.to_torch`` asks
:func:`adapter` for ``"torch"``, which imports the adapter module named in
:data:`ADAPTER_MODULES` the first time (that module registers itself on import). Adding a
framework is one module that calls :func:`register_framework`, plus one entry here (or an
explicit ``register_framework`` call by the user before use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..errors import SpecError

# name -> module that registers the adapter when imported (like an entry point).
ADAPTER_MODULES = {
    "torch": "spark_dl_core.loaders.torch_loader",
    "tf": "spark_dl_core.loaders.tf_loader.loader",
    # loaders with pack= (packed token rows)
    "torch_packed": "spark_dl_core.loaders.torch_loader.packed",
    "tf_packed": "spark_dl_core.loaders.tf_loader.packed",
}
_ADAPTERS: dict[str, Callable[..., Any]] = {}


def register_framework(name: str, factory: Callable[..., Any]) -> None:
    """Make ``factory(dataset, settings)`` the loader for framework ``name``."""
    _ADAPTERS[name] = factory


def adapter(name: str) -> Callable[..., Any]:
    """The registered loader factory for ``name``, importing its module if needed."""
    if name not in _ADAPTERS and name in ADAPTER_MODULES:
        importlib.import_module(ADAPTER_MODULES[name])
    try:
        return _ADAPTERS[name]
    except KeyError:
        known = sorted(set(_ADAPTERS) | set(ADAPTER_MODULES))
        raise SpecError(f"no loader registered for framework {name!r}; known: {known}") from None
