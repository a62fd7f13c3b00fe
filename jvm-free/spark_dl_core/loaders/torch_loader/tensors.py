"""Tensor forms of a batch between decode and delivery: numpy to torch without copies,
token sequences as ``torch.nested`` jagged tensors (made the fast way where this torch
allows), images of several sizes as views of one tensor, and the last step in the main
process (:func:`to_device`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...format.buffers import ImageList, Jagged
from ...ops.read import EncodedImages

if TYPE_CHECKING:
    from ...shard_source import Batch


def to_tensors(batch: Batch) -> dict[str, Any]:
    """numpy → torch without copies where possible.

    Dense numeric columns become tensors; token sequences (:class:`Jagged`) become
    ``torch.nested`` jagged tensors over one values and one offsets buffer (no copy);
    str/bytes/json columns stay numpy object arrays. The form of each column is fixed by
    the dataset (``Dataset.forms``), never by which samples a batch holds.
    """
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            out[name] = _as_tensor(value)
        elif isinstance(value, ImageList):  # images of several sizes: views of one tensor
            out[name] = ImageTensors(_as_tensor(value.flat), value.shapes)
        elif isinstance(value, Jagged):
            values = torch.from_numpy(_writable(np.ascontiguousarray(value.values)))
            out[name] = JaggedTensors(values, value.offsets.astype(np.int64, copy=False))
        elif isinstance(value, EncodedImages):  # bytes for the device: shared, not pickled
            out[name] = value.with_data(_as_tensor(value.data))
        else:
            out[name] = value
    return out


def nested_jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A ``torch.nested`` jagged tensor over ``values`` split at ``offsets`` (no copy).

    The public ``nested_tensor_from_jagged`` also records an autograd view relation, which
    costs about 0.1 ms: at 16 documents a batch that is most of a batch's budget, and a
    loader's batches never need it. Where this torch's jagged class is as expected the
    tensor is made directly (:func:`_jagged_maker`); else the public function.
    """
    return _jagged_maker()(values, offsets)


@functools.cache
def _jagged_maker() -> Any:
    """The fastest way this torch offers to make a jagged tensor that behaves exactly like
    the public function's: torch's jagged wrapper made from its parts (about 20 µs less
    than the class's constructor, which re-checks its inputs and multiplies symbolic
    sizes), else the class, else the public function. Each candidate is checked against the
    public function on a probe; the first that matches is used."""
    public = torch.nested.nested_tensor_from_jagged
    try:
        from torch._C import DispatchKey, DispatchKeySet
        from torch.nested._internal.nested_tensor import NestedTensor, get_tensor_symint
    except ImportError:  # another torch: the public function
        return public
    keys = DispatchKeySet(DispatchKey.NestedTensor).add(DispatchKey.AutogradNestedTensor)

    def direct(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if values.dim() != 1:
            return NestedTensor(values, offsets)
        ragged = get_tensor_symint(offsets, coeff=1)
        size, strides = (offsets.shape[0] - 1, ragged), (ragged, 1)
        out = torch.Tensor._make_wrapper_subclass(
            NestedTensor,
            size,
            strides,
            0,
            torch.contiguous_format,
            values.dtype,
            torch.jagged,
            values.device,
            False,
            False,
            "sizes",
            False,
            True,
            keys,
            storage_size=values.untyped_storage().size(),
        )
        out._ragged_idx, out._size, out._strides = 1, size, strides
        NestedTensor.__init__(out, values, offsets)
        return out

    for candidate in (direct, NestedTensor):
        try:
            if _same_jagged(candidate, public):
                return candidate
        except Exception:  # a candidate this torch cannot run: try the next
            continue
    return public


def _same_jagged(make: Any, public: Any) -> bool:
    """Whether ``make`` gives what the public function gives, on 1-D and 2-D values."""
    for values in (torch.arange(6, dtype=torch.int32), torch.arange(12.0).reshape(6, 2)):
        offsets = torch.tensor([0, 2, 2, 6])
        ours, ref = make(values, offsets), public(values, offsets.clone())
        if type(ours) is not type(ref) or ours.layout != ref.layout or ours.dim() != ref.dim():
            return False
        if ours.dtype != ref.dtype or ours.requires_grad or ours.is_contiguous() is not True:
            return False
        if ours.values().data_ptr() != values.data_ptr() or ours.offsets() is not offsets:
            return False
        if ours._ragged_idx != ref._ragged_idx or ours.shape[0] != ref.shape[0]:
            return False
        if len(ours.stride()) != len(ref.stride()) or ours.stride()[1:] != ref.stride()[1:]:
            return False
        pairs = zip((ours + 1).unbind(), (ref + 1).unbind())
        if not all(torch.equal(a, b) for a, b in pairs):
            return False
        if not torch.equal(ours.to_padded_tensor(-1), ref.to_padded_tensor(-1)):
            return False
    return True


class JaggedTensors:
    """A token-sequence column between decode and delivery: one values tensor and numpy
    offsets. It crosses process boundaries as a plain tensor, splits into batches by
    slicing, and becomes a ``torch.nested`` jagged tensor once, when delivered."""

    __slots__ = ("offsets", "ready", "values")

    def __init__(
        self, values: torch.Tensor, offsets: np.ndarray, ready: torch.Tensor | None = None
    ) -> None:
        self.values, self.offsets = values, offsets
        self.ready = ready  # the offsets as a tensor from 0, when already made

    def split(self, sizes: list[int]) -> list[JaggedTensors]:
        """Consecutive batches of ``sizes`` rows, their offsets made in one step (one
        tensor, a view per batch) rather than per batch."""
        bounds = np.cumsum([0, *sizes])
        counts = np.asarray(sizes) + 1
        block = np.repeat(np.arange(len(sizes)), counts)
        rows = np.arange(int(counts.sum())) - block  # each batch's rows, its end row too
        firsts = self.offsets[bounds[:-1]]
        ready = torch.from_numpy(self.offsets[rows] - firsts[block])
        out = []
        for k in range(len(sizes)):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            values = self.values[int(self.offsets[lo]) : int(self.offsets[hi])]
            out.append(JaggedTensors(values, self.offsets[lo : hi + 1], ready[lo + k : hi + k + 1]))
        return out

    def nested(self) -> torch.Tensor:
        if self.ready is not None:
            return nested_jagged(self.values, self.ready)
        first = int(self.offsets[0])
        values = self.values[first : int(self.offsets[-1])] if first else self.values
        offsets = self.offsets - first if first else self.offsets
        return nested_jagged(values, torch.from_numpy(offsets))


class ImageTensors:
    """Images of several sizes crossing from a worker as one tensor; :meth:`images` gives
    the list of ``[H, W, C]`` tensors (views) the user sees."""

    __slots__ = ("flat", "shapes")

    def __init__(self, flat: torch.Tensor, shapes: np.ndarray) -> None:
        self.flat, self.shapes = flat, shapes

    def rows(self, start: int, stop: int) -> ImageTensors:
        sizes = np.prod(self.shapes, axis=1)
        lo, hi = int(sizes[:start].sum()), int(sizes[:stop].sum())
        return ImageTensors(self.flat[lo:hi], self.shapes[start:stop])

    def images(self) -> list[torch.Tensor]:
        sizes = np.prod(self.shapes, axis=1).tolist()
        parts = torch.split(self.flat, sizes) if sizes else []
        return [p.view(*shape) for p, shape in zip(parts, self.shapes.tolist())]


def _as_tensor(value: np.ndarray) -> torch.Tensor:
    """The shared-memory tensor a :func:`_shared_bytes` array is, else a tensor over it."""
    base = value.base
    if (
        isinstance(base, torch.Tensor)
        and base.is_shared()
        and base.data_ptr() == value.ctypes.data
        and tuple(base.shape) == value.shape
    ):
        return base
    return torch.from_numpy(_writable(value))


def _writable(value: np.ndarray) -> np.ndarray:
    # torch wants writable memory (e.g. memory-mapped shards)
    return value if value.flags.writeable else value.copy()


def _warm_nested() -> None:
    """The first jagged tensor of a process imports torch.distributed.tensor (seconds):
    do it when the loader is built, not in the first batch (workers inherit it on fork)."""
    nested_jagged(torch.zeros(1), torch.tensor([0, 1]))


def take_rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of one column of a worker item (views where possible)."""
    if isinstance(value, (EncodedImages, ImageTensors)):
        return value.rows(start, stop)
    return value[start:stop]


def to_device(batch: dict[str, Any], device: str | None, non_blocking: bool = False) -> Any:
    """Finish a batch in the main process: decode shipped images on ``device`` in one
    batched call per column, and move tensors there."""
    if device is None:
        for name, value in batch.items():
            if isinstance(value, JaggedTensors):
                batch[name] = value.nested()
            elif isinstance(value, ImageTensors):
                batch[name] = value.images()
        return batch
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, JaggedTensors):
            out[name] = value.nested().to(device, non_blocking=non_blocking)
        elif isinstance(value, ImageTensors):
            out[name] = [image.to(device, non_blocking=non_blocking) for image in value.images()]
        elif isinstance(value, EncodedImages):
            out[name] = value.to_device(device)
        elif isinstance(value, torch.Tensor):
            out[name] = value.to(device, non_blocking=non_blocking)
        else:
            out[name] = value
    return out
