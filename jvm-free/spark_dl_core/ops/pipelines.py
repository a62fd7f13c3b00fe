"""A loader's read-time ops compiled by what each declares (:class:`~.transforms.OpFacts`):
per decoded column, the pipeline its decode op starts (found by op name in
:mod:`spark_dl_core.ops.registry`, where the media rooms register their work when
imported), joined by the ops after it that apply to its kind; the other ops apart.
Refusals come here, before any data is read. Nothing here imports those rooms.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..errors import SpecError
from ..format.encodings import get_encoding
from .registry import implementation
from .transforms import Normalize, OpFacts, decoders_of, ops_for


class ColumnPipeline(Protocol):
    """What a decode op's registered implementation makes for one column: it takes the ops
    after the decode that apply to its kind, and turns a batch's encoded values into the
    column's decoded batch. ``on_device``: it can also decode on a torch device (then it
    has ``plan(raws, key, index, where)``, ``run_torch(raws, plan, device)`` and
    ``device_missing(device)``, what this machine lacks to decode there, or None).
    ``fixed_size``: whether every decoded sample has one shape, in every batch; where not, a
    framework whose batches have one signature (tf.data) gives the column ragged."""

    kind: str
    on_device: bool

    @property
    def fixed_size(self) -> bool: ...

    def add(self, op: Any) -> None: ...

    def run(
        self, raws: list[Any], key: bytes, index: np.ndarray, where: Any, alloc: Any
    ) -> Any: ...


def compile_read_ops(
    transforms: list[Any], columns: dict[str, str]
) -> tuple[dict[str, ColumnPipeline], list[Any]]:
    """Split a loader's read-time ops into per-column pipelines and the other ops, by what
    each op declares (:class:`OpFacts`): a decode op starts a pipeline (its implementation
    found by op name in the registry), the ops after it that apply to its kind join it.
    Refuses, before any data is read, naming op and column: a decode of a column that is
    not stored, or stores the wrong kind of value, or is decoded already; an op its
    column's kind does not take; an op that needs a decode before it; ``normalize`` on a
    column that does not hold numbers. ``columns`` maps each stored column to its encoding.
    """
    pipelines: dict[str, ColumnPipeline] = {}
    others: list[Any] = []
    names = list(columns)
    for op in transforms:
        facts: OpFacts = op.facts
        column = getattr(op, "column", None)
        names = op.columns_after(names)  # refuses a column missing at this step
        pipeline = pipelines.get(column) if column is not None else None
        if facts.starts is not None:
            if column not in columns:
                raise SpecError(
                    f"{op.op} (field 'column') names {column!r}, which the dataset does not "
                    f"store (it has {sorted(columns)}); decode ops run on the stored columns, "
                    "before renames"
                )
            if columns[column] not in facts.reads:
                raise SpecError(
                    f"{op.op} on column {column!r}: it stores {columns[column]!r}, not "
                    f"{facts.needs}"
                )
            if pipeline is not None:
                twice = pipeline.kind == facts.starts
                what = "is listed twice" if twice else f"is decoded as {pipeline.kind} already"
                raise SpecError(f"{op.op} on column {column!r} {what}")
            pipelines[column] = implementation(op.op)(op, column)
        elif pipeline is not None:
            kind = pipeline.kind
            if kind not in facts.applies_to:
                raise SpecError(
                    f"{op.op} on {kind} column {column!r}: {kind} columns take "
                    + ", ".join(ops_for(kind))
                )
            pipeline.add(op)
        elif facts.applies_to and not isinstance(op, Normalize):
            decoders = " or ".join(decoders_of(facts.applies_to))
            article = "an" if decoders[:1] in ("a", "e", "i", "o", "u") else "a"
            raise SpecError(f"{op.op} on column {column!r} needs {article} {decoders} of it before")
        else:
            if isinstance(op, Normalize) and column in columns:
                encoding = columns[column]
                if not get_encoding(encoding).numeric:
                    raise SpecError(
                        f"normalize on column {column!r}: it holds {encoding!r} values, "
                        "not numbers (decode images with image_decode first)"
                    )
            others.append(op)
    return pipelines, others
