"""A saved mixture as a Spark table: ``spark.read.format("mds").option("mixture", FILE)``.

The rows are the samples one epoch of the mixture reads (each source's exact share,
repeats included), in that epoch's order, plus the mixture's source column when it has
one, so ``SELECT source, count(*) ... GROUP BY source`` shows the per-source counts. Options:
``epoch`` (default 0), ``seed`` (0), ``shuffle`` (false), ``batch_size`` (1024; the order of
stratified and per-source mixtures, and of any shuffled one read from streams, depends on it),
``streams`` (0: automatic, as a loader's), ``follow`` (false: a source whose
fingerprint changed is refused, see :func:`spark_dl_core.open_mixture`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import LongType, StructField, StructType

from spark_dl_core import Mixture, open_mixture
from spark_dl_core.errors import SpecError
from spark_dl_core.ops.arrow import arrow_schema, batch_to_arrow
from spark_dl_core.order import DEFAULT_WINDOW, resolve_streams

from .types import conform, spark_arrow_schema, to_spark_schema

MIXTURE_READ_OPTIONS = frozenset({"mixture", "epoch", "seed", "shuffle", "batch_size", "follow"})
_ROWS_PER_PARTITION = 1 << 18
_READ_ROWS = 8192
_KEPT_SHARDS = 8


def _int(options: Mapping[str, str], key: str, default: int, low: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(f"option {key!r} must be an integer, got {raw!r}") from None
    if value < low:
        raise SpecError(f"option {key!r} must be >= {low}, got {value}")
    return value


def _bool(options: Mapping[str, str], key: str) -> bool:
    raw = options.get(key, "false").strip().lower()
    if raw not in ("true", "false"):
        raise SpecError(f"option {key!r} must be true or false, got {options[key]!r}")
    return raw == "true"


def _open(options: Mapping[str, str]) -> Mixture:
    return open_mixture(options["mixture"], follow=_bool(options, "follow"))


def _arrow(mixture: Mixture) -> pa.Schema:
    schema = spark_arrow_schema(arrow_schema(mixture))
    if mixture.source_column is not None:
        schema = schema.append(pa.field(mixture.source_column, pa.int64(), nullable=False))
    return schema


def mixture_schema(options: Mapping[str, str]) -> StructType:
    """The Spark schema of a mixture's rows: the sources' common columns (+ source column)."""
    mixture = _open(options)
    schema = to_spark_schema(arrow_schema(mixture))
    if mixture.source_column is not None:
        schema = schema.add(StructField(mixture.source_column, LongType(), nullable=False))
    return schema


class PositionRange(InputPartition):
    """A read partition: positions ``[start, stop)`` of the epoch's order."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__((start, stop))
        self.start, self.stop = start, stop


class MixtureReader(DataSourceReader):
    """Reads one epoch of a saved mixture, split into ranges of its order."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = {k.lower(): v for k, v in options.items()}
        self.epoch = _int(self.options, "epoch", 0, 0)
        self.seed = _int(self.options, "seed", 0, 0)
        self.batch_size = _int(self.options, "batch_size", 1024, 1)
        self.streams = _int(self.options, "streams", 0, 0)
        self.shuffle = _bool(self.options, "shuffle")
        mixture = _open(self.options)
        self.total = len(mixture)
        self.fingerprint = mixture.fingerprint
        self.names = [f.name for f in schema.fields]
        if self.names != mixture_schema(self.options).names:
            raise SpecError("a read schema cannot be given for a mixture: leave .schema() out")

    def partitions(self) -> Sequence[InputPartition]:
        step = _ROWS_PER_PARTITION
        return [PositionRange(a, min(self.total, a + step)) for a in range(0, self.total, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PositionRange)
        mixture = _open(self.options)
        if mixture.fingerprint != self.fingerprint:
            raise SpecError(f"{mixture.shown} changed while it was being read; read it again")
        streams = resolve_streams(mixture, self.shuffle, self.streams)  # as a loader's
        order = mixture.make_order(
            self.seed, self.epoch, self.shuffle, DEFAULT_WINDOW, self.batch_size, streams
        )
        schema = _arrow(mixture)
        loaded: dict[int, Any] = {}
        for start in range(partition.start, partition.stop, _READ_ROWS):
            ids = order.take(start, min(partition.stop, start + _READ_ROWS))
            if len(loaded) > _KEPT_SHARDS:
                loaded.clear()
            decoded = mixture.read(ids, loaded=loaded)
            batch = batch_to_arrow(mixture, decoded)
            if mixture.source_column is not None:
                source = pa.array(mixture.derive(mixture.source_column, ids), pa.int64())
                batch = batch.append_column(mixture.source_column, source)
            yield conform(batch, schema)
