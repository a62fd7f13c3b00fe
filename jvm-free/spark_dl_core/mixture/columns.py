"""The columns a mixture's sources share: picked, checked alike in every source (encoding,
Arrow type, null mask, read-time ops), and one layout and one form per column for them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import ColumnNotFoundError, MixtureError
from ..format.shard import Layout
from ..meta import ColumnPlan
from ..sources.dataset import Dataset

Form = tuple[str, tuple[int, ...] | None]


class MixedLayout(Layout):
    """The mixture's columns when the sources store them in different layouts: no common
    row size, so readers gather per shard (each shard keeps its own layout)."""

    @property
    def row_size(self) -> int | None:
        return None


def user_columns(dataset: Dataset) -> list[str]:
    """A dataset's columns as users name them (null masks left out)."""
    masks = {p.null_mask for p in dataset.plans or [] if p.null_mask}
    return [n for n in dataset.layout.names if n not in masks]


def _picked(
    datasets: Sequence[Dataset], wanted: list[str] | None, labels: Sequence[str]
) -> list[str]:
    """The user columns the mixture reads: ``wanted``, or every source's (then all alike)."""
    user = [user_columns(d) for d in datasets]
    if wanted is None:
        for i, cols in enumerate(user[1:], 1):
            if set(cols) != set(user[0]):
                only0 = sorted(set(user[0]) - set(cols))
                only_i = sorted(set(cols) - set(user[0]))
                common = [c for c in user[0] if c in cols]
                raise MixtureError(
                    f"sources differ in columns: {labels[0]} has {only0} that "
                    f"{labels[i]} lacks, {labels[i]} has {only_i} that "
                    f"{labels[0]} lacks; pick the common ones with columns={common}"
                )
        wanted = user[0]
    for i, cols in enumerate(user):
        missing = [c for c in wanted if c not in cols]
        if missing:
            raise ColumnNotFoundError(
                f"mixture columns {missing} are not in source {i} ({labels[i]}), which has {cols}"
            )
    return wanted


def common_columns(
    datasets: Sequence[Dataset], wanted: list[str] | None, labels: Sequence[str]
) -> tuple[list[str], list[ColumnPlan] | None]:
    """The mixture's stored columns (values and their null masks), checked alike in
    every source: same encoding, same Arrow type, same null mask."""
    plans: list[ColumnPlan] | None = []
    stored: list[str] = []
    for name in _picked(datasets, wanted, labels):
        seen = []
        for d in datasets:
            plan = next((p for p in d.plans or [] if p.name == name), None)
            mask = plan.null_mask if plan is not None else None
            arrow = plan.arrow_type if plan is not None else None
            seen.append((d.encoding(name).name, arrow, mask is not None, plan))
        for i in range(1, len(seen)):
            a, b = seen[0], seen[i]
            what = None
            if a[0] != b[0]:
                what = f"encoding {a[0]!r} in {labels[0]}, {b[0]!r} in {labels[i]}"
            # Arrow's equality: a list's field name (Parquet's, Delta's and Spark's
            # "element", pyarrow's "item") is no part of the type
            elif a[1] is not None and b[1] is not None and a[1] != b[1]:
                what = f"type {a[1]} in {labels[0]}, {b[1]} in {labels[i]}"
            elif a[2] != b[2]:
                masked = labels[0] if a[2] else labels[i]
                what = f"nulls masked in {masked} only"
            if what:
                raise MixtureError(f"column {name!r} differs between sources: {what}")
        stored.append(name)
        first = seen[0][3]
        if first is not None and first.null_mask:
            stored.append(first.null_mask)
        if plans is not None:
            if first is not None and all(s[3] is not None for s in seen):
                plans.append(first)
            else:
                plans = None
    order = list(datasets[0].layout.names)
    stored.sort(key=lambda n: order.index(n))
    return stored, plans


def _read_ops(dataset: Dataset) -> list[Any]:
    return [t for t in (dataset.spec or {}).get("transforms", []) if t.get("at") == "read"]


def shared_read_spec(datasets: Sequence[Dataset], labels: Sequence[str]) -> dict[str, Any] | None:
    """The read-time ops every source's spec records (the same in each, or refused)."""
    reads = [json.dumps(_read_ops(d), sort_keys=True) for d in datasets]
    if any(r != reads[0] for r in reads):
        i = next(i for i, r in enumerate(reads) if r != reads[0])
        raise MixtureError(
            f"source {i} ({labels[i]}) records other read-time transforms in its spec "
            f"than source 0 ({labels[0]}): give them as loader transforms instead"
        )
    return {"transforms": json.loads(reads[0])} if reads and reads[0] else None


def mixed_forms(datasets: Sequence[Dataset], names: Sequence[str]) -> dict[str, Form]:
    """One form per variable ndarray column across sources: dense when every source
    records the same shape, else jagged when each source's values are 1-D, else
    objects (readers conform each batch to it)."""
    forms: dict[str, Form] = {}
    for name in names:
        seen = {d.forms[name] for d in datasets if name in d.forms}
        if not seen:
            continue
        if len(seen) == 1:
            forms[name] = seen.pop()
        elif all(kind in ("jagged", "dense") for kind, _ in seen) and all(
            shape is None or len(shape) == 1 for _, shape in seen
        ):
            forms[name] = ("jagged", None)
        elif any(kind == "auto" for kind, _ in seen):
            forms[name] = ("auto", None)
        else:
            forms[name] = ("objects", None)
    return forms
