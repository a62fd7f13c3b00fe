"""Packed rows over a table read in place, cut from streams (pack version 2): the
Parquet footers give each row group's tokens (``shard_values``) exactly when every stored row
is served as stored, so each rank reads only its streams' row groups, a step's batches are
the same at every world size and a position resumes exactly at another; anything the footers
cannot count exactly (deletion vectors, a filter, null or empty lists) packs one run of rows,
and a count that does not describe a row group read is an error naming its file. Real tables
written by deltalake (and one by PyIceberg), with row groups of 200 rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import WriterProperties, write_deltalake  # noqa: E402
from packing_helpers import (  # noqa: E402
    PACK,
    SETTINGS,
    L,
    check_rank_batches,
    check_resume_at_four_ranks,
    check_whole_documents,
    token_ids,
)

from spark_dl_core.errors import PackError  # noqa: E402
from spark_dl_core.loaders.packed_streams import packed_streams  # noqa: E402
from spark_dl_core.loaders.settings import LoaderSettings  # noqa: E402
from spark_dl_core.sources.row_carry import VersionCarryError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

GROUP = 200  # rows per Parquet row group
APPENDS, ROWS = 4, 1000  # data files, rows each: 20 row groups


def _docs(n: int, seed: int) -> list[np.ndarray]:
    """Documents of 1 to 24 consecutive tokens, unique over every table written here (a gap
    between documents, and each seed its own range), so each token names its document."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 25, size=n)
    starts = seed * 1_000_000 + np.cumsum(lengths + 1) - lengths
    return [np.arange(s, s + k, dtype=np.int32) + 1 for s, k in zip(starts, lengths)]


def _table(docs: list[Any], first_id: int = 0) -> pa.Table:
    tokens = pa.array([None if d is None else list(d) for d in docs], pa.list_(pa.int32()))
    ids = pa.array(np.arange(first_id, first_id + len(docs)), pa.int64())
    emb = pa.array([[float(i)] * 2 for i in range(len(docs))], pa.list_(pa.float32()))
    return pa.table({"id": ids, "tokens": tokens, "emb": emb})


def _write(path: str, docs: list[Any], first_id: int = 0, **options: Any) -> None:
    props = WriterProperties(max_row_group_size=GROUP)
    write_deltalake(path, _table(docs, first_id), writer_properties=props, **options)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Four appends of 1,000 documents, deletion vectors enabled but none written."""
    path = str(tmp_path_factory.mktemp("inplace_pack") / "t")
    config = {"delta.enableDeletionVectors": "true"}
    for k in range(APPENDS):
        _write(path, _docs(ROWS, k + 1), k * ROWS, mode="append", configuration=config)
    return path


def _all_docs() -> list[np.ndarray]:
    return [d for k in range(APPENDS) for d in _docs(ROWS, k + 1)]


def _row_group_tokens(ds: Any, column: str = "tokens") -> np.ndarray:
    """Per shard, the tokens of its rows as the export reads them (canonical order)."""
    lengths = pc.list_value_length(ds.snapshot.to_arrow()[column]).to_numpy()
    offsets = ds.shard_offsets
    return np.array([lengths[offsets[s] : offsets[s + 1]].sum() for s in range(ds.num_shards)])


def _batches(ds: Any, **kw: Any) -> list[dict[str, Any]]:
    return list(ds.iter_batches(**(SETTINGS | kw)))


def test_footers_give_each_row_groups_tokens(table: str) -> None:
    ds = open_delta(table).dataset()
    recorded = ds.shard_values("tokens")
    assert ds.num_shards == APPENDS * ROWS // GROUP
    assert recorded is not None and np.array_equal(recorded, _row_group_tokens(ds))
    assert recorded.sum() == sum(len(d) for d in _all_docs())
    assert ds.shard_values("id") is None  # not a list
    assert ds.shard_values("emb") is None  # a list of floats
    assert ds.shard_values("absent") is None
    assert open_delta(table, columns=["id"]).dataset().shard_values("tokens") is None
    settings = LoaderSettings(batch_size=4, shuffle=True, pack=PACK, streams=4)
    assert packed_streams(ds, settings) == 4


def test_what_the_footers_cannot_count_exactly_is_not_recorded(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    config = {"delta.enableDeletionVectors": "true"}
    _write(path, _docs(600, 7), configuration=config)
    _write(path, _docs(600, 8), 600, mode="append")
    assert open_delta(path).dataset().shard_values("tokens") is not None
    # a filter that removes rows; one that keeps every row changes no row group's tokens
    assert open_delta(path, filter=pc.field("id") >= 100).dataset().shard_values("tokens") is None
    kept = open_delta(path, filter=pc.field("id") >= 0).dataset()
    assert np.array_equal(kept.shard_values("tokens"), _row_group_tokens(kept))
    # new rows since a version: whole data files, counted; with deleted rows, not
    since = open_delta(path, since=0).dataset()
    assert since.num_shards == 3 and np.array_equal(
        since.shard_values("tokens"), _row_group_tokens(since)
    )
    add_deletion_vector(path, [3, 450])  # on the second file
    deleted = open_delta(path)
    assert deleted.has_deletion_vectors and deleted.dataset().shard_values("tokens") is None
    assert open_delta(path, since=0).dataset().shard_values("tokens") is None
    settings = LoaderSettings(batch_size=4, shuffle=True, pack=PACK, streams=4)
    assert packed_streams(deleted.dataset(), settings) == 1  # one run of rows, read whole
    for k, hole in enumerate((None, [])):  # a null document, an empty one: one null leaf
        docs: list[Any] = list(_docs(500, 9))
        docs[250] = hole
        other = str(tmp_path / f"holes{k}")
        _write(other, docs)
        assert open_delta(other).dataset().shard_values("tokens") is None


def test_column_mapping_counts_the_physical_column(tmp_path: Path) -> None:
    path = str(tmp_path / "mapped")
    _write(path, _docs(900, 11), configuration={"delta.columnMapping.mode": "name"})
    stored = pq.read_schema(next(Path(path).glob("**/*.parquet"))).names
    assert "tokens" not in stored  # physical names in the files
    ds = open_delta(path).dataset()
    recorded = ds.shard_values("tokens")
    assert recorded is not None and np.array_equal(recorded, _row_group_tokens(ds))


def _open_loader(table: str) -> Callable[..., Any]:
    """A fresh open of the table's latest version per loader, as each rank of a run does."""
    return lambda **settings: open_delta(table).dataset().to_torch(**settings)


def test_every_token_once_in_whole_documents(table: str) -> None:
    got = _batches(open_delta(table).dataset())
    check_whole_documents(got, _all_docs(), L)
    ids = token_ids(got)
    assert (ids == 0).sum() < 4 * L  # each of the 4 streams pads its last row only


@pytest.mark.parametrize("world", [2, 4])
def test_a_steps_batches_are_the_one_rank_batches_and_ranks_read_their_share(
    table: str, world: int
) -> None:
    ds = open_delta(table).dataset()
    for locality in check_rank_batches(_open_loader(table), _batches(ds), world, SETTINGS):
        assert locality["streams"] == 4 and locality["streams_read"] == 4 // world
        # its streams' row groups, and at most a window's at the other streams' ends
        assert locality["shards_touched"] <= ds.num_shards / world + 2, locality


def test_resume_mid_epoch_at_another_world_size_is_exact(table: str) -> None:
    one = _batches(open_delta(table).dataset())
    check_resume_at_four_ranks(_open_loader(table), one, 9, SETTINGS)


def test_workers_give_the_batches_of_one_process(table: str) -> None:
    kw = SETTINGS | {"rank": 1, "world_size": 2, "even_batches": True}
    here = [b["input_ids"].numpy() for b in _open_loader(table)(**kw)]
    there = [b["input_ids"].numpy() for b in _open_loader(table)(**(kw | {"num_workers": 2}))]
    assert len(here) == len(there) > 0
    assert all(np.array_equal(a, b) for a, b in zip(here, there))


def test_a_streamed_position_inside_an_epoch_does_not_carry_to_another_version(
    tmp_path: Path,
) -> None:
    """A run over version N carries on to N+1 only from an epoch's start: a position in
    streamed batches inside one is refused, as one in packed rows is."""
    path = str(tmp_path / "t")
    _write(path, _docs(800, 12))
    loader = open_delta(path).dataset().to_torch(**SETTINGS)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["pack"]["version"] == 2 and state["pack"]["batches"] == 1
    _write(path, _docs(400, 13), 800, mode="append")
    newer = open_delta(path).dataset().to_torch(**SETTINGS)
    with pytest.raises(VersionCarryError, match="inside an epoch"):
        newer.load_state_dict(state, strict=False)


def test_a_row_group_whose_tokens_differ_from_its_footer_is_an_error_naming_it(
    tmp_path: Path,
) -> None:
    """A data file replaced under an open snapshot (same rows, other documents): the counts
    the footers gave no longer describe it, and reading it says so before a row is cut."""
    path = str(tmp_path / "t")
    _write(path, _docs(800, 14))
    ds = open_delta(path).dataset(cache=False)
    assert ds.shard_values("tokens") is not None
    file = next(Path(path).glob("*.parquet"))
    stored = pq.read_table(file)
    shorter = [d[:-1] if len(d) > 1 else d for d in stored["tokens"].to_pylist()]
    stored = stored.set_column(1, "tokens", pa.array(shorter, stored.schema.field("tokens").type))
    pq.write_table(stored, file, row_group_size=GROUP)
    with pytest.raises(PackError, match=rf"{file.name} \(row group \d\).*records") as info:
        list(ds.iter_batches(**SETTINGS))
    assert info.value.field == "column"


def test_an_iceberg_table_counts_by_field_id_until_a_delete(tmp_path: Path) -> None:
    """Iceberg's in-place read is the same dataset: a renamed token column is counted from
    the files' column of its field id; a position delete leaves the counts unrecorded."""
    pytest.importorskip("pyiceberg")
    from iceberg_helpers import catalog, position_deletes

    from spark_dl_core.tables.iceberg.table import open_iceberg

    cat = catalog(tmp_path)
    rows = pa.concat_tables([_table(_docs(700, 15)), _table(_docs(500, 16), 700)])
    props = {"write.parquet.row-group-limit": str(GROUP)}
    t = cat.create_table("db.t", schema=rows.schema, properties=props)
    t.append(rows.slice(0, 700))
    t.append(rows.slice(700))
    with cat.load_table("db.t").update_schema() as update:
        update.rename_column("tokens", "toks")
    ds = open_iceberg("db.t", catalog=cat).dataset()
    recorded = ds.shard_values("toks")
    assert ds.num_shards == 7 and recorded is not None
    assert np.array_equal(recorded, _row_group_tokens(ds, "toks"))
    t = cat.load_table("db.t")
    first = next(iter(t.scan().plan_files())).file.file_path
    position_deletes(t, {first: [10]})
    assert open_iceberg("db.t", catalog=cat).dataset().shard_values("toks") is None
