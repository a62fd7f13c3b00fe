"""PyTorch loading: an iterable of dicts of tensors, sharded over ranks and workers, resumable.

Internally a ``torch.utils.data.IterableDataset`` whose workers each decode *whole batches*
(``DataLoader(batch_size=None)``), so no per-sample Python objects cross process
boundaries. Which batch each rank and worker makes, and what a saved state means, is
defined in :mod:`spark_dl_core.order`.

By concern: :mod:`.tensors` (a batch's tensor forms and its delivery), :mod:`.shared`
(shared-memory segments and slabs between workers and the main process), :mod:`.units` (the
batches a reader decodes at once) and :mod:`.loader` (the workers' batches and
:class:`TorchLoader`). Importing the package
registers the ``torch`` framework.
"""

from __future__ import annotations

from ..frameworks import register_framework
from .loader import EpochHook, TorchLoader, check_device, resolve_rank
from .tensors import (
    ImageTensors,
    JaggedTensors,
    _jagged_maker,
    _same_jagged,
    nested_jagged,
    take_rows,
    to_device,
    to_tensors,
)

__all__ = [
    "EpochHook",
    "ImageTensors",
    "JaggedTensors",
    "TorchLoader",
    "_jagged_maker",
    "_same_jagged",
    "check_device",
    "nested_jagged",
    "resolve_rank",
    "take_rows",
    "to_device",
    "to_tensors",
]

register_framework("torch", TorchLoader)
