"""Building a mixture: :func:`mix` from ``Source(...)`` entries, :func:`open_mixture` from a
saved :class:`~.spec.MixtureSpec` (each source checked against its recorded
fingerprint)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..errors import MixtureError
from ..order import BATCHING
from ..shard_source import TableSnapshot
from ..sources.dataset import Dataset
from ..tables.kinds import REOPEN, open_dataset
from .dataset import Mixture
from .spec import (
    MIXTURE_VERSION,
    InPlaceDelta,
    InPlaceIceberg,
    MixtureSpec,
    Source,
    SourceSpec,
    parse_count,
    parse_schedule,
)


def _open_source(
    source: Source, index: int, cache_dir: str | None, storage_options: dict[str, Any] | None
) -> Dataset:
    target = source.dataset
    if isinstance(target, Dataset):
        if isinstance(target, Mixture):
            raise MixtureError(f"source {index}: a mixture cannot be a source of another")
        return target
    if isinstance(target, TableSnapshot):  # a pinned table version, read in place
        return target.dataset()
    if not isinstance(target, (str, os.PathLike)):
        raise MixtureError(
            f"source {index}: {type(target).__name__} is not a dataset path or an open "
            "Dataset or table snapshot (DataFrames: use spark_dl.mix)"
        )
    try:
        return open_dataset(str(target), cache_dir=cache_dir, storage_options=storage_options)
    except MixtureError:
        raise
    except Exception as exc:
        raise MixtureError(f"source {index} ({target}) cannot be opened: {exc}") from exc


# the spec's field per kind of table read in place
_IN_PLACE: dict[str, type[InPlaceDelta] | type[InPlaceIceberg]] = {
    "delta": InPlaceDelta,
    "iceberg": InPlaceIceberg,
}


def _in_place_record(dataset: Dataset) -> dict[str, Any]:
    """What reopens a source that is a table read in place, as its spec's field (none for a
    dataset, which its path reopens)."""
    record = dataset.in_place_record()
    if record is None:
        return {}
    kind, arguments = record
    if kind not in _IN_PLACE:  # the spec's fields for tables read in place (their JSON form)
        raise MixtureError(
            f"{dataset.shown}: a {kind} table read in place cannot be saved in a mixture spec"
        )
    return {kind: _IN_PLACE[kind](**arguments)}


def _reopen_in_place(
    record: InPlaceDelta | InPlaceIceberg,
    index: int,
    label: str,
    storage_options: dict[str, Any] | None,
) -> Dataset:
    """A saved mixture's source that is a table read in place, opened again."""
    if record.filter is not None:
        raise MixtureError(
            f"source {index} ({label}): a table read in place with filter="
            f"{record.filter} cannot be reopened from a saved mixture (a filter expression "
            "has no JSON form); export the filtered snapshot (snap.write_mds(path)) and mix "
            "the export, or build the mixture again with mix()"
        )
    try:
        kind = "delta" if isinstance(record, InPlaceDelta) else "iceberg"
        return REOPEN[kind](record.model_dump(), storage_options)
    except Exception as exc:
        raise MixtureError(f"source {index} ({label}) cannot be opened: {exc}") from exc


def mix(
    sources: Sequence[Source],
    *,
    epoch_size: int | str | None = None,
    batching: str = "random",
    source_column: str | None = None,
    columns: Sequence[str] | None = None,
    schedule: Sequence[Any] | None = None,
    cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Mixture:
    """Read several datasets as one: each source's share of every epoch, exactly.

    See :class:`Source` for weights and docs/mixtures.md for the rules. ``batching``:
    ``"random"`` (sources interleaved by the shuffle), ``"stratified"`` (every batch holds
    each source's share), ``"per_source"`` (each batch from one source). ``source_column``
    adds an int64 column holding each row's source index. ``columns`` picks the columns
    (needed when the sources' columns differ). ``schedule``: ``[(start, {name: weight}),
    ...]``, weights that change at run positions (samples since the start of the run).
    """
    if isinstance(sources, Source) or not isinstance(sources, Sequence) or not sources:
        raise MixtureError("mix() takes a non-empty list of Source(...)")
    for i, s in enumerate(sources):
        if not isinstance(s, Source):
            raise MixtureError(f"source {i}: expected Source(...), got {type(s).__name__}")
    if batching not in BATCHING:
        raise MixtureError(f"batching={batching!r}: must be one of {list(BATCHING)}")
    if columns is not None and (isinstance(columns, str) or not columns):
        raise MixtureError(f"columns={columns!r}: a non-empty list of column names")
    size = None if epoch_size is None else parse_count(epoch_size)
    stages = None if schedule is None else parse_schedule(schedule)
    datasets = [_open_source(s, i, cache_dir, storage_options) for i, s in enumerate(sources)]
    specs = []
    for i, (s, d) in enumerate(zip(sources, datasets)):
        choose = None if s.choose is None else parse_count(s.choose, f"source {i} choose")
        for field in ("proportion", "repeat"):
            value = getattr(s, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise MixtureError(f"source {i} ({s.label(i)}): {field}={value!r} is not a number")
        specs.append(
            SourceSpec(
                path=d.path,
                name=s.name,
                fingerprint=d.fingerprint,
                samples=int(d.shard_offsets[-1]),
                proportion=s.proportion,
                repeat=s.repeat,
                choose=choose,
                lineage=d.source,
                **_in_place_record(d),
            )
        )
    spec = MixtureSpec(
        sources=specs,
        epoch_size=size,
        batching=batching,
        source_column=source_column,
        columns=None if columns is None else list(columns),
        schedule=stages,
    )
    return Mixture(spec, datasets)


def open_mixture(
    spec: str | os.PathLike[str] | dict[str, Any] | MixtureSpec,
    *,
    follow: bool = False,
    cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Mixture:
    """Reopen a saved mixture (a JSON file, a JSON string, a dict or a MixtureSpec).

    Each source must still have the fingerprint recorded; a source that changed is refused
    (the saved order would no longer be the same samples) unless ``follow=True``, which
    takes the sources as they are now (a new fingerprint) and warns.
    """
    if isinstance(spec, MixtureSpec):
        parsed = spec
    else:
        try:
            if isinstance(spec, dict):
                parsed = MixtureSpec.model_validate(spec)
            else:
                text = str(spec)
                if not text.lstrip().startswith("{"):
                    with open(text, encoding="utf-8") as f:
                        text = f.read()
                parsed = MixtureSpec.model_validate_json(text)
        except OSError as exc:
            raise MixtureError(f"mixture spec {spec!s} cannot be read: {exc}") from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise MixtureError(f"mixture spec is not valid: {problems}") from None
    if parsed.version != MIXTURE_VERSION:
        raise MixtureError(
            f"mixture spec version {parsed.version}; this spark-dl reads {MIXTURE_VERSION}"
        )
    datasets = []
    sources = []
    for i, s in enumerate(parsed.sources):
        table = s.delta if s.delta is not None else s.iceberg
        if table is not None:
            d = _reopen_in_place(table, i, s.name or s.path, storage_options)
        else:
            d = _open_source(Source(s.path), i, cache_dir, storage_options)
        if s.fingerprint is None:  # a hand-written spec: the source as it is now
            s = s.model_copy(
                update={"fingerprint": d.fingerprint, "samples": int(d.shard_offsets[-1])}
            )
        elif d.fingerprint != s.fingerprint:
            if not follow:
                raise MixtureError(
                    f"source {i} ({s.name or s.path}) changed: fingerprint {d.fingerprint[:16]}…, "
                    f"the mixture recorded {s.fingerprint[:16]}…; open_mixture(..., "
                    "follow=True) takes it as it is now"
                )
            warnings.warn(
                f"mixture source {i} ({s.name or s.path}) changed since the mixture was saved; "
                "following it (new fingerprint, new order)",
                stacklevel=2,
            )
            s = s.model_copy(
                update={"fingerprint": d.fingerprint, "samples": int(d.shard_offsets[-1])}
            )
        datasets.append(d)
        sources.append(s)
    return Mixture(parsed.model_copy(update={"sources": sources}), datasets)
