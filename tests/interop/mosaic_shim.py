"""Test-only import shim for Mosaic Streaming in its side environment.

``streaming`` imports transformers, torchvision, matplotlib and cloud SDKs at module import
although its MDS writer and local reader never call them. The side environment installs
mosaicml-streaming with ``--no-deps`` plus its light codec dependencies, so those packages
are absent; :func:`install` registers a last-resort import finder that hands out empty stub
modules for them. Real packages, when installed, still win: the finder sits at the end of
``sys.meta_path``. Attribute access on a stub module yields an empty placeholder class, which
is enough for ``isinstance`` checks and base classes at import time.

Never imported by the library; only ``tests/interop/mosaic_oracle.py`` uses it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

STUBBED = (
    "alipcs_py",
    "azure",
    "boto3",
    "botocore",
    "databricks",
    "google",
    "huggingface_hub",
    "matplotlib",
    "oci",
    "pandas",
    "paramiko",
    "pyspark",
    "torchvision",
    "transformers",
)


class _StubModule(types.ModuleType):
    """A package whose every public attribute is a fresh placeholder class."""

    def __getattr__(self, attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        placeholder = type(attr, (), {"__module__": self.__name__})
        setattr(self, attr, placeholder)
        return placeholder


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Append the stub finder to ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
        sys.meta_path.append(_StubFinder())
