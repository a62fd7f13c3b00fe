"""A row group of variable-size rows converted straight into place (tables/parquet/
variable_rows): the writer's bytes exactly, the writer's path for what it does not cover,
and an in-place dataset of ragged lists converting, caching and reading through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
from deltalake import WriterProperties, write_deltalake

from spark_dl_core.spec import MAX_SHARD_SIZE, DatasetSpec
from spark_dl_core.tables.delta import in_place as delta_inplace
from spark_dl_core.tables.delta.table import open_delta
from spark_dl_core.tables.parquet.variable_rows import variable_shard
from spark_dl_core.writer import ShardWriter


class _Memory:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write_bytes(self, name: str, data: Any) -> None:
        self.files[name] = bytes(data)


def _writer(table: pa.Table, spec: DatasetSpec) -> ShardWriter:
    writer = ShardWriter(_Memory(), spec)  # type: ignore[arg-type]
    writer.start(table.schema)
    return writer


def _both_ways(table: pa.Table, spec: DatasetSpec) -> tuple[Any, bytes, dict[str, Any]]:
    """``variable_shard``'s answer, and the bytes and shapes write() + finish() give."""
    writer = _writer(table, spec)
    assert writer.plans is not None
    config = writer._config_bytes
    whole = variable_shard(writer.plans, config, spec.shard_size, table, _empty)
    for batch in table.to_batches():
        writer.write(batch)
    infos = writer.finish()
    assert len(infos) == 1
    return whole, writer.store.files[infos[0].raw_data.basename], infos[0].shapes or {}  # type: ignore[attr-defined]


def _empty(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def _ragged(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.random(int(offsets[-1]), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(n), pa.int64()),
            "x": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        }
    )


def test_ragged_rows_are_laid_out_as_the_writer_lays_them() -> None:
    """Ragged lists (empty ones too), strings and bytes of other lengths, nested lists,
    shape headers of two widths in one batch (dims past 255), dictionary strings, scalars
    of each width, over several batches: the bytes and shapes of the writer's path."""
    n = 500
    rng = np.random.default_rng(2)
    base = _ragged(n, 1)
    grid = [[[1, 2]] * int(k) for k in rng.integers(1, 4, n)]
    wide = [[0] * (300 if i % 7 == 0 else 3) for i in range(n)]
    table = base.append_column("s", pa.array([f"s{i}" * (i % 5) for i in range(n)]))
    table = table.append_column("b", pa.array([bytes(i % 9) for i in range(n)]))
    table = table.append_column("grid", pa.array(grid, pa.list_(pa.list_(pa.int32()))))
    table = table.append_column("wide", pa.array(wide, pa.list_(pa.int16())))
    table = table.append_column(
        "cat", pa.array([f"c{i % 3}" for i in range(n)]).dictionary_encode()
    )
    table = table.append_column("f", pa.array(rng.random(n), pa.float64()))
    table = table.append_column("flag", pa.array(np.arange(n) % 2 == 0))
    table = table.append_column("when", pa.array(np.arange(n).astype("datetime64[us]")))
    cases = [
        (table, DatasetSpec()),
        (pa.Table.from_batches(table.to_batches(max_chunksize=70)), DatasetSpec()),
        (base, DatasetSpec(columns={"x": "ndarray:float32"})),
        (_ragged(3, 0), DatasetSpec()),
    ]
    for data, spec in cases:
        whole, written, shapes = _both_ways(data, spec)
        assert whole is not None
        assert whole[0].tobytes() == written
        assert whole[1] == shapes


def test_what_the_writer_must_write_is_left_to_it() -> None:
    """Nulls, a null mask column, a shard past its size limit, columns other than the
    plans': None, and the writer's path writes (or refuses) them."""
    nulls = pa.table({"x": pa.array([[1.0], None], pa.list_(pa.float32()))})
    for data, spec in ((nulls, DatasetSpec()), (nulls, DatasetSpec(nulls="mask"))):
        writer = _writer(data, spec)
        assert writer.plans is not None
        assert (
            variable_shard(writer.plans, writer._config_bytes, MAX_SHARD_SIZE, data, _empty) is None
        )
    table = _ragged(50, 3)
    writer = _writer(table, DatasetSpec())
    assert writer.plans is not None
    config = writer._config_bytes
    assert variable_shard(writer.plans, config, 1000, table, _empty) is None  # past the limit
    other = table.rename_columns(["id", "y"])
    assert variable_shard(writer.plans, config, MAX_SHARD_SIZE, other, _empty) is None
    assert variable_shard(writer.plans, config, MAX_SHARD_SIZE, table.slice(0, 0), _empty) is None


def test_ragged_row_groups_read_in_place_convert_once_and_match_the_table(
    tmp_path: Path,
) -> None:
    """A Delta table of ragged ``list<float>`` rows in three row groups: each converted
    row group is what the writer's path gives for it, the rows read back are the table's,
    and a later open of the same cache reads the cached files (nothing converted again)."""
    path, cache = str(tmp_path / "t"), str(tmp_path / "cache")
    data = _ragged(900, 4)
    write_deltalake(path, data, writer_properties=WriterProperties(max_row_group_size=300))
    ds = open_delta(path).dataset(cache_dir=cache)
    assert ds.num_shards == 3 and ds.forms["x"] == ("jagged", None)
    before = delta_inplace.conversions
    for shard in range(ds.num_shards):
        group = ds._finished(ds._groups[shard])
        spec = {"compression": None, "hashes": [], "shard_size": MAX_SHARD_SIZE}
        writer = _writer(group, ds.user_spec.model_copy(update=spec))
        writer.write(group)
        info = writer.finish()[0]
        written = writer.store.files[info.raw_data.basename]  # type: ignore[attr-defined]
        assert ds.load_shard(shard).raw.tobytes() == written
    assert delta_inplace.conversions == before + 3
    again = open_delta(path).dataset(cache_dir=cache)
    read = again.to_arrow()
    assert read.column("id").to_pylist() == data.column("id").to_pylist()
    assert read.column("x").to_pylist() == data.column("x").to_pylist()
    assert delta_inplace.conversions == before + 3


def test_a_first_batch_from_empty_caches_is_the_warm_paths_and_the_tables(
    tmp_path: Path,
) -> None:
    """The shuffled first batch of a fresh read with empty caches (converted straight into
    place), of a second read served by the cached files, and of a read with no cache at all
    are the same rows, and each row is the table's row of that id."""
    path, cache = str(tmp_path / "t"), str(tmp_path / "cache")
    data = _ragged(1200, 5)
    write_deltalake(path, data, writer_properties=WriterProperties(max_row_group_size=300))
    rows = dict(zip(data.column("id").to_pylist(), data.column("x").to_pylist()))

    def first(**options: Any) -> Any:
        ds = open_delta(path).dataset(**options)
        return next(iter(ds.iter_batches(64, shuffle=True, seed=3)))

    cold = first(cache_dir=cache)  # served from the rows it needs (load_rows)
    before = delta_inplace.conversions
    list(open_delta(path).dataset(cache_dir=cache).iter_batches(300))  # a whole pass
    converted = delta_inplace.conversions - before
    warm = first(cache_dir=cache)
    assert converted <= 4 and delta_inplace.conversions == before + converted  # warm: cached
    uncached = first(cache=False)
    ids = cold["id"].tolist()
    assert sorted(ids) != ids  # shuffled across the row groups
    for other in (warm, uncached):
        assert other["id"].tolist() == ids
        assert len(other["x"]) == len(cold["x"]) == 64
        for a, b in zip(other["x"], cold["x"]):
            assert a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()
    for row, values in zip(ids, cold["x"]):
        assert values.tolist() == rows[row]
