"""Variable-width columns decoded by batch, with one output form per column (issue #9)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import ShardError, SpecError
from spark_dl_core.format import buffers
from spark_dl_core.format.buffers import Jagged
from spark_dl_core.format.encodings import encoding_names, get_encoding

N = 600


def _tokens(n: int, seed: int = 0) -> list[list[int]]:
    """The first 200 rows all have length 3 (so early batches look dense), then ragged."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 1000, size=3 if i < 200 else int(rng.integers(0, 9))).tolist()
        for i in range(n)
    ]


def _table(n: int = N) -> pa.Table:
    rng = np.random.default_rng(1)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "tok": pa.array(_tokens(n), pa.list_(pa.int32())),
            "feat": pa.array(
                rng.random((n, 4)).astype(np.float32).tolist(), pa.list_(pa.float32())
            ),
            "s": pa.array([f"text {i}" for i in range(n)]),
            "j": pa.array([{"a": i, "b": [i, i + 1]} for i in range(n)]),
        }
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "ds"
    write_mds(_table(), str(path), DatasetSpec(shard_size="4KiB"))
    return path


def test_forms_follow_the_recorded_shapes(written: Path) -> None:
    ds = open_dataset(written)
    assert ds.num_shards > 5
    assert ds.forms == {"tok": ("jagged", None), "feat": ("dense", (4,))}
    meta = json.loads((written / "spark_dl.json").read_text())
    assert all(m["shapes"]["feat"] == [4] for m in meta["shards"])
    assert any(m["shapes"]["tok"] is None for m in meta["shards"])


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_forms_never_change_within_an_epoch(written: Path, workers: int) -> None:
    """A ragged column is a nested jagged tensor in every batch, also the all-length-3 ones
    (it used to be a [B, 3] tensor first, then an object array)."""
    ds = open_dataset(written)
    want = {i: t for i, t in enumerate(_tokens(N))}
    seen = 0
    for batch in ds.to_torch(batch_size=64, num_workers=workers):
        tok, feat = batch["tok"], batch["feat"]
        assert tok.is_nested and tok.dtype == torch.int32
        assert isinstance(feat, torch.Tensor) and not feat.is_nested
        assert feat.shape == (len(batch["id"]), 4) and feat.dtype == torch.float32
        assert isinstance(batch["s"], np.ndarray) and batch["s"].dtype == object
        offsets = tok.offsets()
        values = tok.values()
        for k, sample in enumerate(batch["id"].tolist()):
            got = values[offsets[k] : offsets[k + 1]].tolist()
            assert got == want[sample]
        seen += len(batch["id"])
    assert seen == N


def test_jagged_tensor_shares_the_values_buffer() -> None:
    from spark_dl_core.loaders.torch_loader import to_device, to_tensors

    values = np.arange(10, dtype=np.int32)
    out = to_device(to_tensors({"t": Jagged(values, np.array([0, 4, 4, 10]))}), None)["t"]
    assert out.is_nested and out.values().data_ptr() == values.ctypes.data
    public = torch.nested.nested_tensor_from_jagged(
        torch.from_numpy(values), torch.tensor([0, 4, 4, 10])
    )
    assert type(out) is type(public) and out.layout == public.layout
    assert out.shape[0] == 3 and out.offsets().tolist() == [0, 4, 4, 10]
    assert [t.tolist() for t in out.unbind()] == [t.tolist() for t in public.unbind()]


def test_fast_jagged_maker_is_checked_against_the_public_function() -> None:
    from spark_dl_core.loaders.torch_loader import _jagged_maker, _same_jagged

    public = torch.nested.nested_tensor_from_jagged
    maker = _jagged_maker()
    assert maker.__name__ == "direct"  # the pinned torch gets the fast path
    assert _same_jagged(maker, public)

    def wrong_rows(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return maker(values, torch.cat([offsets[:1], offsets[1:] - 1]))

    assert not _same_jagged(wrong_rows, public)  # a maker that differs is refused


def test_shuffled_batches_across_shards_keep_each_sample(written: Path) -> None:
    ds = open_dataset(written)
    want = _tokens(N)
    rows = _table().column("feat").to_pylist()
    for batch in ds.iter_batches(batch_size=100, shuffle=True, seed=3):
        assert batch["tok"].dtype == object  # numpy users: one array per sample
        assert batch["feat"].shape == (len(batch["id"]), 4)
        for i, tok, feat in zip(batch["id"].tolist(), batch["tok"], batch["feat"]):
            assert tok.tolist() == want[i]
            np.testing.assert_allclose(feat, rows[i], rtol=0)


def test_tf_ragged_from_row_splits_and_dense(written: Path) -> None:
    import tensorflow as tf

    ds = open_dataset(written)
    tfds = ds.to_tf(batch_size=64, columns=["id", "tok", "feat"])
    want = _tokens(N)
    for batch in tfds:
        assert isinstance(batch["tok"], tf.RaggedTensor)
        assert isinstance(batch["feat"], tf.Tensor) and batch["feat"].shape[1:] == (4,)
        for i, row in zip(batch["id"].numpy().tolist(), batch["tok"].to_list()):
            assert row == want[i]


def test_to_arrow_round_trips_every_shape(written: Path) -> None:
    assert open_dataset(written).to_arrow().equals(_table())


def test_dense_record_meeting_a_ragged_batch_names_column_and_shard(
    written: Path, tmp_path: Path
) -> None:
    """A column recorded with one shape that holds another is an error, not a new type."""
    import shutil

    copy = tmp_path / "lying"
    shutil.copytree(written, copy)
    meta = json.loads((copy / "spark_dl.json").read_text())
    for m in meta["shards"]:
        m["shapes"]["tok"] = [3]
    del meta["digest"]  # an unsealed file, as written before the digest existed
    (copy / "spark_dl.json").write_text(json.dumps(meta))
    ds = open_dataset(copy)
    assert ds.forms["tok"] == ("dense", (3,))
    with pytest.raises(ShardError, match=r"shard .*shard\.\d+\.mds.*column 'tok'.*\(3,\)"):
        for _ in ds.iter_batches(batch_size=64):
            pass


def test_all_empty_arrays_read_back(tmp_path: Path) -> None:
    """Issue #12, 2.2: a shard whose arrays are all empty was written but not readable."""
    table = pa.table({"id": [1, 2], "a": pa.array([[], []], pa.list_(pa.float64()))})
    write_mds(table, str(tmp_path / "e"))
    ds = open_dataset(tmp_path / "e")
    assert ds.to_arrow().equals(table)
    (batch,) = list(ds.to_torch(batch_size=4))
    assert batch["a"].shape == (2, 0)


def test_empty_dataset_to_arrow(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([[1.0]], pa.list_(pa.float64()))})
    write_mds(table, str(tmp_path / "one"))
    assert open_dataset(tmp_path / "one").to_arrow().equals(table)


def test_read_transforms_in_the_spec_apply_in_every_reader(tmp_path: Path) -> None:
    """``"at": "read"`` transforms were ignored by iter_batches, to_torch and to_arrow."""
    table = pa.table({"x": np.arange(8, dtype=np.float64), "y": np.arange(8)})
    spec = DatasetSpec(
        transforms=[
            {"op": "normalize", "column": "x", "mean": 2.0, "std": 4.0, "at": "read"},
            {"op": "cast", "column": "y", "to": "int16", "at": "read"},
        ]
    )
    write_mds(table, str(tmp_path / "t"), spec)
    ds = open_dataset(tmp_path / "t")
    want = ((np.arange(8) - 2.0) / 4.0).astype(np.float32)
    (batch,) = list(ds.iter_batches(batch_size=8))
    np.testing.assert_array_equal(batch["x"], want)
    assert batch["y"].dtype == np.int16
    (tb,) = list(ds.to_torch(batch_size=8))
    assert tb["x"].dtype == torch.float32 and torch.equal(tb["x"], torch.from_numpy(want))
    arrow = ds.to_arrow()
    assert arrow.schema.field("x").type == pa.float32()
    assert arrow.schema.field("y").type == pa.int16()
    np.testing.assert_array_equal(arrow.column("x").to_numpy(), want)


def test_spark_read_applies_read_transforms(classic_spark: Any, tmp_path: Path) -> None:
    import spark_dl

    spark_dl.register(classic_spark)
    table = pa.table({"x": np.arange(4, dtype=np.float64)})
    spec = DatasetSpec(
        transforms=[{"op": "normalize", "column": "x", "mean": 1.0, "std": 2.0, "at": "read"}]
    )
    write_mds(table, str(tmp_path / "t"), spec)
    rows = classic_spark.read.format("mds").load(str(tmp_path / "t")).collect()
    assert [r.x for r in rows] == [-0.5, 0.0, 0.5, 1.0]


def test_json_decodes_in_one_step_and_bad_values_name_the_row() -> None:
    from spark_dl_core.errors import EncodingError
    from spark_dl_core.format.buffers import Pieces, offsets_from_lengths
    from spark_dl_core.format.encodings import DecodeOptions

    encoding = get_encoding("json")
    values = [{"a": 1}, [1, 2], "x", None, 3.5]
    pieces = encoding.encode(pa.array([json.dumps(v) for v in values]).cast(pa.string()), "c")
    texts = [json.dumps(v).encode() for v in values]
    pieces = Pieces(
        np.frombuffer(b"".join(texts), np.uint8),
        offsets=offsets_from_lengths(np.array([len(t) for t in texts])),
    )
    assert list(encoding.decode(pieces, 5, "c", DecodeOptions())) == values
    bad = [b"1", b"2,3", b"4"]
    pieces = Pieces(
        np.frombuffer(b"".join(bad), np.uint8),
        offsets=offsets_from_lengths(np.array([len(t) for t in bad])),
    )
    with pytest.raises(EncodingError, match="column 'c': stored value 1 is not valid JSON"):
        encoding.decode(pieces, 3, "c", DecodeOptions())


def test_one_encoding_registry() -> None:
    names = encoding_names()
    assert "jpegarray" in names and "jpeg_array" in names and "ndarray" in names
    for name in names:
        assert get_encoding(name).name == name
    assert get_encoding("ndarray:int32:2,3").size == 24
    with pytest.raises(ValueError, match="unknown MDS encoding 'nope'"):
        get_encoding("nope")


def test_equal_length_variable_arrays_take_the_row_gather(written: Path) -> None:
    """Shards whose samples all have one size are row matrices (the fixed-width gather)."""
    ds = open_dataset(written.parent / "ds")
    table = pa.table({"f": pa.array(np.ones((50, 8), np.float32).tolist(), pa.list_(pa.float32()))})
    path = written.parent / "eq"
    write_mds(table, str(path))
    ds = open_dataset(path)
    data = ds.load_shard(0)
    assert data.row_matrix is not None
    (batch,) = list(ds.iter_batches(batch_size=64))
    assert batch["f"].shape == (50, 8) and batch["f"].dtype == np.float32


def test_row_matrix_needs_every_size_header_equal(tmp_path: Path) -> None:
    """Two variable columns whose sizes trade places keep every sample's length equal: the
    size headers (checked as strided columns of the rows) tell them apart."""
    a = [[1.0, 2.0], [3.0, 4.0, 5.0]] * 20
    b = [[6.0, 7.0, 8.0], [9.0, 1.0]] * 20
    table = pa.table(
        {"a": pa.array(a, pa.list_(pa.float32())), "b": pa.array(b, pa.list_(pa.int32()))}
    )
    write_mds(table, str(tmp_path / "swap"))
    ds = open_dataset(tmp_path / "swap")
    data = ds.load_shard(0)
    assert len(set(np.diff(data.offsets).tolist())) == 1 and data.row_matrix is None
    got = ds.to_arrow()
    assert got["a"].to_pylist() == a and got["b"].to_pylist() == b
    same = pa.table({"a": pa.array(a[:1] * 9, pa.list_(pa.float32())), "b": pa.array(b[:1] * 9)})
    write_mds(same, str(tmp_path / "same"))
    equal = open_dataset(tmp_path / "same")
    assert equal.load_shard(0).row_matrix is not None
    assert equal.to_arrow()["b"].to_pylist() == b[:1] * 9


def test_a_batch_across_shards_keeps_the_requested_order(written: Path) -> None:
    ds = open_dataset(written)
    wanted = np.array([N - 1, 0, 5, N - 2, 300, 1])
    batch = ds.read(wanted, jagged=True)
    assert batch["id"].tolist() == wanted.tolist()
    want = _tokens(N)
    tok = batch["tok"]
    for k, i in enumerate(wanted.tolist()):
        assert tok.values[tok.offsets[k] : tok.offsets[k + 1]].tolist() == want[i]


def test_write_normalize_on_a_string_column_names_op_and_column(tmp_path: Path) -> None:
    table = pa.table({"s": ["a", "b"], "x": [1.0, 2.0]})
    spec = DatasetSpec(transforms=[{"op": "normalize", "column": "s", "mean": 0.0, "std": 1.0}])
    with pytest.raises(SpecError, match=r"normalize on column 's'.*numbers"):
        write_mds(table, tmp_path / "d", spec)
    assert not (tmp_path / "d" / "index.json").exists()


@pytest.mark.parametrize("columns", [None, ["tok"], ["tok", "id"], ["s", "tok", "feat"]])
def test_token_columns_read_straight_from_the_shards(
    written: Path, columns: list[str] | None
) -> None:
    """Token sequences are copied from the shards' bytes into one values buffer (no
    intermediate pieces); every column of a batch across shards stays in requested order."""
    ds = open_dataset(written)
    table = _table()
    want = _tokens(N)
    rng = np.random.default_rng(5)
    for size in (1, 7, 64, 250):
        wanted = rng.choice(N, size=size, replace=False)
        batch = ds.read(wanted, columns, jagged=True)
        assert list(batch) == (columns or list(table.column_names))
        tok = batch["tok"]
        assert isinstance(tok, Jagged) and tok.values.dtype == np.int32
        for k, i in enumerate(wanted.tolist()):
            assert tok.values[tok.offsets[k] : tok.offsets[k + 1]].tolist() == want[i]
        if "id" in batch:
            assert batch["id"].tolist() == wanted.tolist()
        if "s" in batch:
            assert batch["s"].tolist() == [f"text {i}" for i in wanted.tolist()]


@pytest.mark.parametrize("group", [None, 1, 3])
def test_in_process_groups_give_the_same_batches(written: Path, group: int | None) -> None:
    """In-process loaders decode several batches at once for variable columns; the batches,
    their order and the resume position are those of one decode per batch."""
    ds = open_dataset(written)
    kw: dict[str, Any] = {"batch_size": 7, "shuffle": True, "seed": 3}
    reference = [
        (b["id"].tolist(), [t.tolist() for t in b["tok"].unbind()])
        for b in ds.to_torch(**kw, group=1)
    ]
    loader = ds.to_torch(**kw, group=group)
    got = []
    for step, batch in enumerate(loader):
        assert batch["tok"].is_nested and batch["feat"].shape == (len(batch["id"]), 4)
        got.append((batch["id"].tolist(), [t.tolist() for t in batch["tok"].unbind()]))
        if step == 10:
            state = loader.state_dict()
    assert got == reference
    rest = ds.to_torch(**kw, group=group)
    rest.load_state_dict(state)
    assert [b["id"].tolist() for b in rest] == [ids for ids, _ in reference[11:]]


@pytest.fixture(scope="module")
def mixed_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    """A dense ``array<float>`` column beside a string column whose lengths vary only in
    later rows: early shards are row matrices, later ones are not."""
    n = 400
    rng = np.random.default_rng(2)
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": pa.array(rng.random((n, 4)).astype(np.float32).tolist(), pa.list_(pa.float32())),
            "s": ["same" if i < 200 else "v" * (i % 7) for i in range(n)],
        }
    )
    path = tmp_path_factory.mktemp("mixed") / "ds"
    write_mds(table, str(path), DatasetSpec(shard_size="2KiB"))
    return path, table


@pytest.mark.parametrize("workers", [0, 2])
def test_equal_length_arrays_stay_dense_across_row_and_general_shards(
    mixed_rows: tuple[Path, pa.Table], workers: int
) -> None:
    path, table = mixed_rows
    ds = open_dataset(path)
    assert ds.forms == {"x": ("dense", (4,))}
    kinds = {ds.load_shard(s).row_matrix is not None for s in range(ds.num_shards)}
    assert kinds == {True, False}
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float32)
    seen = 0
    for columns in (None, ["x", "id"]):
        loader = ds.to_torch(batch_size=32, shuffle=True, num_workers=workers, columns=columns)
        for batch in loader:
            ids = batch["id"].numpy()
            assert batch["x"].dtype == torch.float32 and batch["x"].shape == (len(ids), 4)
            np.testing.assert_array_equal(batch["x"].numpy(), x[ids])
            seen += len(ids)
    assert seen == 2 * len(x)


@pytest.mark.parametrize("c_gather", [True, False])
def test_a_shard_whose_headers_differ_takes_the_general_decode(
    tmp_path: Path, c_gather: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one size whose ndarray headers differ (another shape in some row) are not
    viewed as a dense block: the general decode reports the recorded-shape mismatch (the
    C row gather checks each row's header as the numpy one does)."""
    if not c_gather:
        monkeypatch.setattr(buffers, "_buffers", None)
    table = pa.table({"x": pa.array([[1.0, 2.0]] * 20, pa.list_(pa.float32()))})
    write_mds(table, str(tmp_path / "ds"))
    ds = open_dataset(tmp_path / "ds")
    data = ds.load_shard(0)
    assert data.row_matrix is not None and ds.row_spans(data, ["x"]) is not None
    at, _ = data.row_span(0)
    where = int(data.offsets[0]) + 3 * data.row_matrix.shape[1] + at + 1
    (shard,) = (tmp_path / "ds").glob("shard.*.mds")
    raw = bytearray(shard.read_bytes())
    raw[where] = 1  # row 3's shape byte: (1,) instead of (2,), same row size
    shard.write_bytes(bytes(raw))
    tampered = open_dataset(tmp_path / "ds")
    with pytest.raises(ShardError, match=r"column 'x'"):
        list(tampered.iter_batches(batch_size=8, verify_hashes=False))


def test_leaving_an_in_process_pass_stops_reading_and_errors_reach_the_loop(
    written: Path,
) -> None:
    """In-process loaders decode groups of batches: leaving a pass early stops the
    prefetch thread; an error in a later shard reaches the training loop, naming it."""
    import threading

    ds = open_dataset(written)
    before = set(threading.enumerate())  # other tests' abandoned iterators may hold theirs
    loader = ds.to_torch(batch_size=5, shuffle=True)
    for step, _ in enumerate(loader):
        if step == 3:
            break
    # The pass is left without waiting for a shard load in flight; the prefetch thread
    # ends when that load returns, and starts no other.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = {t.name for t in set(threading.enumerate()) - before}
        if "spark-dl-prefetch" not in alive:
            break
        time.sleep(0.01)
    assert "spark-dl-prefetch" not in alive

    import shutil

    broken = written.parent / "broken-late-shard"
    if not broken.exists():
        shutil.copytree(written, broken)
        last = sorted(broken.glob("shard.*.mds"))[-1]
        last.write_bytes(last.read_bytes()[:-7])  # truncated: found when it is loaded
    loader = open_dataset(broken).to_torch(batch_size=5, verify_hashes=False)
    delivered = 0
    with pytest.raises(ShardError, match=r"shard\.\d+\.mds"):
        for batch in loader:
            delivered += len(batch["id"])
    assert 0 < delivered < N


def test_an_append_keeps_the_recorded_shapes(tmp_path: Path) -> None:
    """Appending keeps each earlier shard's shape record: an equal-length column stays
    dense (it used to turn jagged once the dataset had been appended to)."""
    rows = np.arange(200, dtype=np.float32).reshape(50, 4)
    table = pa.table({"x": pa.array(rows.tolist(), pa.list_(pa.float32()))})
    path = str(tmp_path / "ds")
    write_mds(table, path)
    write_mds(table, path, mode="append")
    ds = open_dataset(path)
    assert ds.forms == {"x": ("dense", (4,))}
    meta = json.loads((tmp_path / "ds" / "spark_dl.json").read_text())
    assert [m["shapes"] for m in meta["shards"]] == [{"x": [4]}, {"x": [4]}]
    (batch,) = list(ds.iter_batches(batch_size=100))
    np.testing.assert_array_equal(batch["x"], np.concatenate([rows, rows]))


@pytest.mark.parametrize("length", [3, 300])
def test_range_copies_match_numpy_slicing(length: int) -> None:
    """copy_pieces (the C extension where built, numpy slicing otherwise) puts every range
    where it belongs, for short and long ranges, and refuses ranges outside a buffer."""
    from spark_dl_core.format import buffers

    rng = np.random.default_rng(length)
    src = rng.integers(0, 256, 100_000, dtype=np.uint8)
    lengths = rng.integers(0, length, 500).astype(np.int64)
    starts = rng.integers(0, len(src) - length, 500).astype(np.int64)
    at = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    want = np.concatenate([src[s : s + n] for s, n in zip(starts, lengths)])
    for module in {buffers._buffers, None}:
        saved, buffers._buffers = buffers._buffers, module
        try:
            out = np.zeros(int(lengths.sum()), np.uint8)
            buffers.copy_pieces(out, at, src, starts, lengths)
            np.testing.assert_array_equal(out, want)
        finally:
            buffers._buffers = saved
    if buffers._buffers is None:
        pytest.skip("spark_dl_core.format._buffers was not built (no C compiler at install)")
    with pytest.raises(ValueError, match="outside a buffer"):
        buffers._buffers.copy_ranges(
            np.zeros(4, np.uint8), np.array([2]), src, np.array([0]), np.array([3])
        )


def test_unknown_columns_and_indices_are_typed_errors(written: Path) -> None:
    """Asking for a column or sample a dataset does not have is a spark-dl error naming
    the dataset (and still a KeyError / IndexError, as for a dict or a list)."""
    from spark_dl_core.errors import ColumnNotFoundError, SampleIndexError, SparkDLError

    ds = open_dataset(written)
    with pytest.raises(ColumnNotFoundError) as found:
        ds.read(np.array([0]), ["tok", "nope"])
    assert isinstance(found.value, (KeyError, SparkDLError))
    assert str(found.value).startswith(str(written)) and "'nope'" in str(found.value)
    with pytest.raises(SampleIndexError, match=rf"{N} samples") as index:
        ds.read(np.array([N]))
    assert isinstance(index.value, IndexError)
    with pytest.raises(ColumnNotFoundError):
        ds.to_arrow(columns=["nope"])


def test_rows_gathered_in_c_equal_numpy_across_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shuffled batches of fixed-width rows (an int, a float and a dense float32[5] array)
    drawn from several shards at once: the one-pass C gather into column blocks gives the
    batches numpy's sort / gather / scatter / split gives, and the right rows."""
    n = 3000
    x = np.arange(n * 5, dtype=np.float32).reshape(n, 5) / 7
    x_column = pa.array(list(x), pa.list_(pa.float32()))
    table = pa.table({"id": np.arange(n), "w": np.arange(n) * 0.5, "x": x_column})
    write_mds(table, str(tmp_path / "ds"), DatasetSpec(shard_size=1 << 14))
    ds = open_dataset(tmp_path / "ds")
    assert ds.num_shards > 8

    def batches() -> list[dict[str, np.ndarray]]:
        loader = ds.to_torch(batch_size=256, shuffle=True, seed=4, shuffle_window=4)
        return [{k: v.numpy().copy() for k, v in b.items()} for b in loader]

    fast = batches()
    monkeypatch.setattr(buffers, "_buffers", None)
    slow = batches()
    assert len(fast) == len(slow) == -(-n // 256)
    for a, b in zip(fast, slow, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(a["x"], x[a["id"]])
        np.testing.assert_array_equal(a["w"], a["id"] * 0.5)
