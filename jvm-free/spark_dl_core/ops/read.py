"""Read-time ops applied to decoded batches: the spec's recorded ``"at": "read"`` ops, then
a loader's own ``transforms=``, the same for every loader and for random access.

Decoded columns (image, audio, video...) run the pipelines their decode ops start, found
through the op registry; ``normalize`` on numeric columns runs on numpy; other ops go through
Arrow. :class:`EncodedImages` carries a batch's images to a device that decodes them there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ColumnNotFoundError, SpecError
from ..format.buffers import Jagged

if TYPE_CHECKING:
    from ..shard_source import Batch, ShardSource

# Decoded kinds whose pipelines read the shard's memory as it is (views, not copies).
VIEWED_KINDS = ("audio", "video")


class EncodedImages:
    """A column on its way to the device: encoded bytes plus their plan.

    DataLoader workers send this (``device="cuda"``) for pipelines that decode on a device
    (``on_device``: images); the main process decodes the whole batch in one call on the
    GPU and applies the same plan (:meth:`ImagePipeline.run_torch`). The images lie back to
    back in one buffer (``data``, split at ``offsets``): made by the workers' allocator, in
    shared memory, so a batch's bytes reach the main process without being pickled.
    """

    __slots__ = ("data", "offsets", "pipeline", "plan")

    def __init__(self, pipeline: Any, data: Any, offsets: np.ndarray, plan: Any) -> None:
        self.pipeline, self.data, self.offsets, self.plan = pipeline, data, offsets, plan

    @classmethod
    def pack(
        cls, pipeline: Any, raws: list[Any], plan: Any, alloc: Callable[..., np.ndarray]
    ) -> EncodedImages:
        """``raws`` copied back to back into one buffer from ``alloc``."""
        sizes = np.array([len(raw) for raw in raws], dtype=np.int64)
        offsets = np.zeros(len(raws) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = alloc((int(offsets[-1]),))
        for raw, at, size in zip(raws, offsets[:-1].tolist(), sizes.tolist()):
            data[at : at + size] = np.frombuffer(raw, dtype=np.uint8)
        return cls(pipeline, data, offsets, plan)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def raws(self) -> list[Any]:
        """Each image's bytes: views of ``data`` (a numpy array or a torch tensor)."""
        at = self.offsets.tolist()
        return [self.data[at[i] : at[i + 1]] for i in range(len(self))]

    def rows(self, start: int, stop: int) -> EncodedImages:
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        offsets = self.offsets[start : stop + 1] - first
        return EncodedImages(
            self.pipeline, self.data[first:last], offsets, self.plan.rows(start, stop)
        )

    def with_data(self, data: Any) -> EncodedImages:
        """The same images over another form of the buffer (a torch tensor, for transport)."""
        return EncodedImages(self.pipeline, data, self.offsets, self.plan)

    def to_device(self, device: str) -> Any:
        return self.pipeline.run_torch(self.raws, self.plan, device)


class ReadOps:
    """Read-time transforms of one loader: the spec's ``"at": "read"`` ones, then the
    loader's own ``transforms=``, checked against the dataset's columns before any data is
    read. Decoded columns (image, audio, video...) run the pipelines their decode ops start,
    found through the op registry (:func:`~spark_dl_core.ops.pipelines.compile_read_ops`);
    ``normalize`` on numeric columns runs on numpy; other ops go through Arrow.
    """

    def __init__(
        self,
        dataset: ShardSource,
        transforms: Any,
        columns: list[str] | None,
        *,
        seed: int = 0,
        epoch: int = 0,
        device: str | None = None,
        spec: bool = True,
    ) -> None:
        from .arrow import read_transforms
        from .transforms import parse_transforms

        self.dataset = dataset
        recorded = read_transforms(dataset) if spec else []
        if columns is not None:  # the spec's ops on columns left out have nothing to do
            recorded = _ops_on_columns(recorded, columns)
        self.transforms = recorded + parse_transforms(transforms)
        self.pipelines: dict[str, Any] = {}  # decoded column -> its ColumnPipeline
        self.others: list[Any] = []
        self.device = device
        # Makes decoded image batches (uint8, by shape); DataLoader workers allocate them in
        # shared memory (see torch_loader), so they reach the main process uncopied.
        self.alloc: Callable[[tuple[int, ...]], np.ndarray] = _empty_bytes
        names = columns if columns is not None else list(dataset.layout.names)
        _check_columns_setting(dataset, names)
        if not self.transforms:
            return
        from .pipelines import compile_read_ops
        from .transforms import augment_key

        kinds = {n: dataset.columns.get(n, "?") for n in names}
        self.pipelines, self.others = compile_read_ops(self.transforms, kinds)
        self.key = augment_key(dataset.fingerprint, seed, epoch)

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def names_after(self, names: list[str]) -> list[str]:
        """The column names a batch with columns ``names`` has after these ops."""
        for op in self.transforms:
            names = op.columns_after(names)
        return names

    def source_of(self, name: str) -> str | None:
        """The column an output column ``name`` holds, renames walked back; None for one
        an op makes (``tokenize``'s output, a ``python`` op's columns)."""
        from .transforms import PythonTransform, Rename

        for op in reversed(self.transforms):
            if isinstance(op, Rename):
                name = {new: old for old, new in op.mapping.items()}.get(name, name)
            elif isinstance(op, PythonTransform) or getattr(op, "output", None) == name:
                return None
        return name

    @property
    def transformed(self) -> set[str]:
        """Columns a pipeline (image, audio, video) turns into dense decoded batches."""
        return set(self.pipelines)

    def apply(self, batch: Batch, index: np.ndarray) -> Batch:
        """Run the ops on one decoded batch whose samples have global indices ``index``."""
        if not self.transforms:
            return batch
        from .transforms import Normalize

        on_device = self.device is not None  # the loader's check_device: a torch device
        for name, pipeline in self.pipelines.items():
            viewed = getattr(pipeline, "kind", "") in VIEWED_KINDS  # memoryviews: as they are
            raws = list(batch[name]) if viewed else [bytes(r) for r in batch[name]]

            def where(i: int, message: str, name: str = name) -> str:
                return self._where(name, int(index[i]), message)

            if on_device and pipeline.on_device:  # decoded in the main process, on the device
                plan = pipeline.plan(raws, self.key, index, where)
                batch[name] = EncodedImages.pack(pipeline, raws, plan, self.alloc)
            else:
                batch[name] = pipeline.run(raws, self.key, index, where, self.alloc)
        arrow_ops: list[Any] = []
        for op in self.others:
            if isinstance(op, Normalize) and not arrow_ops:
                batch[op.column] = _normalize(batch[op.column], op)
            else:
                arrow_ops.append(op)
        if arrow_ops:
            batch = self._through_arrow(batch, arrow_ops)
        return batch

    def _where(self, column: str, sample: int, message: str) -> str:
        file, local = self.dataset.locate(sample)
        return f"column {column!r}, shard {file!r}, sample {local} (global {sample}): {message}"

    def _through_arrow(self, batch: Batch, ops: list[Any]) -> Batch:
        import pyarrow as pa

        from .arrow import arrow_to_numpy, numpy_to_arrow
        from .transforms import apply_transforms

        arrays, names = [], []
        for name, value in batch.items():
            if isinstance(value, np.ndarray) and value.dtype == object:
                arrays.append(pa.array(list(value)))
            else:
                arrays.append(numpy_to_arrow(value, _arrow_type_of(value)))
            names.append(name)
        record = pa.RecordBatch.from_arrays(arrays, names=names)
        for op in ops:
            record = apply_transforms(record, [op.model_copy(update={"at": "read"})], "read")
        return {n: arrow_to_numpy(record.column(n)) for n in record.schema.names}


def random_access_ops(dataset: ShardSource, asked: list[str] | None) -> ReadOps | None:
    """The spec's read-time ops as ``ds[i]`` runs them, so random access gives what the
    loaders give: seeded ops with seed 0 and epoch 0 (a loader's first epoch at its default
    seed draws the same for that sample). ``asked`` are output names (after renames); ops
    that only change columns not asked are left out (no image decoded for ``ds["label"]``).
    None when the spec has no read ops."""
    from .arrow import read_transforms

    ops = read_transforms(dataset)
    if not ops:
        return None
    if asked is not None:
        out = [*dataset.layout.names, *dataset.derived]
        for op in ops:
            out = op.columns_after(out)
        missing = [c for c in asked if c not in out]
        if missing:
            raise ColumnNotFoundError(
                f"{dataset.shown} has no column(s) {missing} after its read-time ops; it has {out}"
            )
        ops = _ops_reaching(ops, set(asked))
    return ReadOps(dataset, ops, None, spec=False)


def _ops_reaching(ops: list[Any], wanted: set[str] | None) -> list[Any]:
    """The ops whose effect can reach the columns ``wanted`` at the end (walked backwards:
    an op on one column that is not wanted is dropped; renames map names back; an op that
    makes new columns from others, such as ``python``, keeps every op before it)."""
    from .transforms import Drop, PythonTransform, Rename, Select

    kept = []
    for op in reversed(ops):
        column = getattr(op, "column", None)
        if column is not None and not isinstance(op, PythonTransform):
            written = getattr(op, "output", None) or column
            if wanted is not None:
                if written not in wanted:
                    continue
                wanted.add(column)
        elif isinstance(op, Rename) and wanted is not None:
            back = {new: old for old, new in op.mapping.items()}
            wanted = {back.get(name, name) for name in wanted}
        elif not isinstance(op, (Select, Drop)):
            wanted = None
        kept.append(op)
    return kept[::-1]


def _ops_on_columns(ops: list[Any], names: list[str]) -> list[Any]:
    """The spec's read ops as a loader reading only ``names`` (its ``columns=``) runs them:
    an op on a column left out is skipped (``normalize x`` with ``columns=["id"]``), as
    random access skips it; renames, selects and drops keep the columns read (skipped when
    none is). From a ``python`` op on, which may read any column, every op stays."""
    from .transforms import Drop, PythonTransform, Rename, Select

    kept: list[Any] = []
    present = list(names)
    for at, op in enumerate(ops):
        if isinstance(op, PythonTransform):
            return kept + ops[at:]
        column = getattr(op, "column", None)
        if column is not None and column not in present:
            continue
        if isinstance(op, Rename):
            mapping = {old: new for old, new in op.mapping.items() if old in present}
            if not mapping:
                continue
            op = op.model_copy(update={"mapping": mapping})
        elif isinstance(op, (Select, Drop)):
            chosen = [c for c in op.columns if c in present]
            if not chosen:
                continue
            op = op.model_copy(update={"columns": chosen})
        present = op.columns_after(present)
        kept.append(op)
    return kept


def _check_columns_setting(dataset: ShardSource, names: list[str]) -> None:
    """The loader's ``columns=`` setting, checked against the dataset when it is built."""
    stored = list(dataset.layout.names)
    missing = [c for c in names if c not in stored]
    if missing:
        raise ColumnNotFoundError(
            f"setting columns=: {dataset.shown} has no column(s) {missing}; it has {stored}"
        )
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise SpecError(f"setting columns= names column {twice[0]!r} more than once")


def _empty_bytes(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=np.uint8)


def alloc_typed(
    alloc: Callable[[tuple[int, ...]], np.ndarray], shape: tuple[int, ...], dtype: Any
) -> np.ndarray:
    """An empty ``dtype`` array of ``shape`` in memory from ``alloc`` (which makes uint8
    arrays). In DataLoader workers ``alloc``'s arrays lie over a shared-memory torch tensor:
    the result is then that tensor viewed as ``dtype``, so the batch reaches the main process
    as it is. A batch in private memory is moved to a fresh shared segment when a worker
    sends it, which cost 8-12 ms a tensor whatever its size (torch 2.13, measured; a 2 MB
    audio batch decodes in about 15 ms)."""
    dtype = np.dtype(dtype)
    raw = alloc((int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,))
    base, torch = raw.base, sys.modules.get("torch")
    if torch is not None and isinstance(base, torch.Tensor) and base.data_ptr() == raw.ctypes.data:
        typed = torch.from_numpy(np.empty(0, dtype)).dtype
        return base.view(typed).view(shape).numpy()
    return raw.view(dtype).reshape(shape)


def _arrow_type_of(value: Any) -> Any:
    import pyarrow as pa

    if isinstance(value, Jagged):
        return pa.list_(pa.from_numpy_dtype(value.values.dtype))
    out = pa.from_numpy_dtype(value.dtype)
    for dim in reversed(value.shape[1:]):
        out = pa.list_(out, dim)
    return out


def _normalize(value: Any, op: Any) -> Any:
    """``(x - mean) / std`` as float32 on a numeric column (dense or jagged)."""
    mean, std = np.float32(op.mean), np.float32(op.std)
    if isinstance(value, Jagged):
        return Jagged((value.values.astype(np.float32) - mean) / std, value.offsets)
    return (np.asarray(value).astype(np.float32) - mean) / std
