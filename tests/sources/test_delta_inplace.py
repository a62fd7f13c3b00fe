"""A pinned Delta snapshot read in place (row groups as shards): the rows, order, resume and
ops of an MDS dataset, with no export. Real tables written by deltalake, real deletion
vectors (committed as delta-spark does, see tests/sources/test_delta.py), real JPEGs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core import SpecError, mix  # noqa: E402
from spark_dl_core.mixture.spec import Source  # noqa: E402
from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

ROWS_PER_APPEND = 400
APPENDS = 3
GROUP = 90  # rows per Parquet row group: every file holds several


def _data(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "emb": pa.array(
                [[float(i) / (j + 1) for j in range(8)] for i in ids], pa.list_(pa.float32())
            ),
            "tok": pa.array(
                [list(range(i, i + 1 + (i * 7919) % 11)) for i in ids], pa.list_(pa.int64())
            ),
            "name": [f"row{i}" for i in ids],
            "part": ["ab"[i % 2] for i in ids],
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three appends (two partition files each), a deletion vector after each append."""
    path = str(tmp_path_factory.mktemp("inplace") / "t")
    props = WriterProperties(max_row_group_size=GROUP)
    config = {"delta.enableDeletionVectors": "true"}
    versions = []
    for k in range(APPENDS):
        write_deltalake(
            path,
            _data(k * ROWS_PER_APPEND, ROWS_PER_APPEND),
            mode="append",
            partition_by=["part"],
            writer_properties=props,
            configuration=config if k == 0 else None,
        )
        add_deletion_vector(path, [0, 5, 91, 92, 150 + k])
        versions.append(deltalake.DeltaTable(path).version())
    return {"path": path, "versions": versions}


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b["id"])]


def test_rows_and_canonical_order_equal_the_export_reader(table: dict[str, Any]) -> None:
    snap = open_delta(table["path"])
    expected = snap.to_arrow()
    assert snap.has_deletion_vectors and len(snap) == expected.num_rows < APPENDS * ROWS_PER_APPEND
    ds = snap.dataset()
    assert ds.num_shards > len(snap.files) >= 6  # several row groups per file
    got = ds.to_arrow()
    assert got.column_names == expected.column_names
    assert got.to_pylist() == expected.to_pylist()  # same rows, same canonical order
    assert ds.forms == {"emb": ("dense", (8,)), "tok": ("jagged", None)}
    assert ds.lineage == snap.lineage() and ds.lineage["version"] == snap.version
    first = snap[0]
    assert first["id"] == expected["id"][0].as_py() and first["name"] == expected["name"][0].as_py()
    assert snap["id"].tolist() == expected["id"].to_pylist()
    assert snap[[2, 1]]["name"].tolist() == expected["name"].to_pylist()[2:0:-1]


def test_shuffled_epoch_every_live_row_once(table: dict[str, Any]) -> None:
    snap = open_delta(table["path"])
    live = sorted(snap.to_arrow()["id"].to_pylist())
    deleted = set(range(APPENDS * ROWS_PER_APPEND)) - set(live)
    for epoch in (0, 1):
        ids = _ids(snap.iter_batches(64, shuffle=True, seed=3, epoch=epoch))
        assert sorted(ids) == live and not deleted & set(ids)
        assert ids != live  # shuffled
    batch = next(iter(snap.iter_batches(16, shuffle=True, seed=3, columns=["emb", "tok"])))
    assert batch["emb"].shape == (16, 8) and batch["emb"].dtype == np.float32
    assert len(batch["tok"]) == 16


def test_same_order_fresh_process_and_any_world_size(table: dict[str, Any]) -> None:
    snap = open_delta(table["path"])
    mine = _ids(snap.iter_batches(50, shuffle=True, seed=11))
    code = (
        "import json,sys; from spark_dl_core.tables.delta.table import open_delta; "
        "s=open_delta(sys.argv[1]); print(json.dumps([s.fingerprint, "
        "[int(i) for b in s.iter_batches(50, shuffle=True, seed=11) for i in b['id']]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, table["path"]], capture_output=True, text=True, check=True
    )
    fingerprint, theirs = json.loads(out.stdout)
    assert fingerprint == snap.fingerprint and theirs == mine
    for world in (2, 3):
        ranks = [
            _ids(
                snap.iter_batches(
                    50, shuffle=True, seed=11, rank=r, world_size=world, even_batches=False
                )
            )
            for r in range(world)
        ]
        assert sorted(i for r in ranks for i in r) == sorted(mine)


def test_to_torch_two_workers(table: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    snap = open_delta(table["path"])
    loader = snap.to_torch(batch_size=64, shuffle=True, seed=5, num_workers=2)
    ids = [int(i) for b in loader for i in b["id"]]
    assert sorted(ids) == sorted(snap.to_arrow()["id"].to_pylist())
    assert ids == _ids(snap.iter_batches(64, shuffle=True, seed=5))


def test_resume_at_another_world_size(table: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    snap = open_delta(table["path"])
    kw = {"batch_size": 40, "shuffle": True, "seed": 9, "even_batches": False}
    seen, states = [], []
    for r in range(2):
        loader = snap.to_torch(rank=r, world_size=2, **kw)
        it = iter(loader)
        for _ in range(4):
            seen += [int(i) for i in next(it)["id"]]
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0] == states[1] and states[0]["consumed"] == len(seen)
    rest = []
    again = open_delta(table["path"])  # a fresh open, as a restarted job does
    for r in range(3):
        loader = again.to_torch(rank=r, world_size=3, **kw)
        loader.load_state_dict(states[0])
        rest += [int(i) for b in loader for i in b["id"]]
    counts = Counter(seen + rest)
    assert sorted(counts) == sorted(again.to_arrow()["id"].to_pylist())
    assert set(counts.values()) == {1}
    # a state from another version is refused (the fingerprint differs)
    older = open_delta(table["path"], version=table["versions"][-2])
    assert older.fingerprint != again.fingerprint
    loader = older.to_torch(**kw)
    with pytest.raises(SpecError, match="loader state is for dataset"):
        loader.load_state_dict(states[0])
        next(iter(loader))


def test_sample_equals_loader_sample_and_other_versions_differ(table: dict[str, Any]) -> None:
    snap = open_delta(table["path"])
    order = snap.sample_order(32, shuffle=True, seed=2)
    batch = next(iter(snap.iter_batches(32, shuffle=True, seed=2)))
    for k, i in enumerate(order[0][:5].tolist()):
        sample = snap[i]
        assert sample["id"] == batch["id"][k] and sample["name"] == batch["name"][k]
        assert np.array_equal(sample["emb"], batch["emb"][k])
    v0 = open_delta(table["path"], version=0)
    assert v0.fingerprint != snap.fingerprint
    assert open_delta(table["path"], version=0).fingerprint == v0.fingerprint


def test_mix_with_an_mds_dataset(table: dict[str, Any], tmp_path: Path) -> None:
    snap = open_delta(table["path"], columns=["id", "name"])
    from spark_dl_core import write_mds

    other = pa.table({"id": pa.array(range(10_000, 10_300), pa.int64()), "name": ["m"] * 300})
    write_mds(other, str(tmp_path / "mds"))
    m = mix([Source(snap, proportion=0.5), Source(str(tmp_path / "mds"), proportion=0.5)])
    ids = _ids(m.iter_batches(64, shuffle=True, seed=1))
    assert len(ids) == len(m) == len(snap) + 300
    from_delta = [i for i in ids if i < 10_000]
    assert len(from_delta) == m.counts[0] and set(from_delta) <= set(snap["id"].tolist())
    assert m.lineage[0]["lineage"]["version"] == snap.version


def test_snapshot_columns_are_a_datasets_and_its_projection_is_named(
    table: dict[str, Any], tmp_path: Path
) -> None:
    """``snap.columns`` was the ``columns=`` projection (None without one) where a dataset's
    ``columns`` maps each column to its encoding; the projection is ``snap.projection``."""
    from spark_dl_core import open_dataset

    whole = open_delta(table["path"])
    assert whole.projection is None
    assert list(whole.columns) == ["id", "emb", "tok", "name", "part"]
    snap = open_delta(table["path"], columns=["name", "id"])
    assert snap.projection == ["name", "id"]
    assert snap.columns == snap.dataset().columns == {"name": "str", "id": "int64"}
    snap.write_mds(str(tmp_path / "export"))
    assert open_dataset(tmp_path / "export").columns == snap.columns
    assert snap.lineage()["columns"] == ["name", "id"]  # what exports record, as before


def test_mix_accepts_list_fields_named_element_and_item(
    table: dict[str, Any], tmp_path: Path
) -> None:
    """Delta (as Parquet and Spark) names a list's field ``element``, pyarrow ``item``: one
    Arrow type, so the table (in place or exported) mixes with a dataset pyarrow wrote; a
    column whose type really differs is still refused."""
    from spark_dl_core import MixtureError, open_dataset, write_mds

    snap = open_delta(table["path"], columns=["id", "emb", "tok"])
    assert str(snap.output_schema.field("tok").type) == "list<element: int64>"
    snap.write_mds(str(tmp_path / "export"))
    ids = np.arange(10_000, 10_050)
    other = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "emb": pa.array([[float(i)] * 8 for i in ids], pa.list_(pa.float32())),
            "tok": pa.array([list(range(i % 5 + 1)) for i in ids], pa.list_(pa.int64())),
        }
    )
    assert str(other.schema.field("tok").type) == "list<item: int64>"
    write_mds(other, str(tmp_path / "mds"))
    for delta in (snap, str(tmp_path / "export")):
        m = mix([Source(delta), Source(str(tmp_path / "mds"))])  # each source once
        got = m.to_arrow()
        assert len(got) == len(m) == len(snap) + 50
        from_mds = got.filter(pa.compute.greater_equal(got["id"], 10_000)).sort_by("id")
        assert from_mds["tok"].to_pylist() == other["tok"].to_pylist()
    widened = other.set_column(1, "emb", pa.array([[1.0] * 8] * 50, pa.list_(pa.float64())))
    write_mds(widened, str(tmp_path / "f64"))
    assert open_dataset(tmp_path / "f64").plans[1].encoding != "ndarray:float32"
    with pytest.raises(MixtureError, match="column 'emb' differs"):
        mix([Source(snap), Source(str(tmp_path / "f64"))])


def test_saved_mixture_with_a_source_read_in_place_reopens(
    table: dict[str, Any], tmp_path: Path
) -> None:
    """A mixture of an in-place snapshot (an older version, a projection, rows new since a
    version, a read spec) and an export is saved and opened again, by open_mixture and by
    ``spark-dl inspect``: the same sources, fingerprint and batches."""
    import contextlib

    from spark_dl.cli import main
    from spark_dl_core import open_mixture, write_mds

    first, second, _ = table["versions"]
    old = open_delta(table["path"], version=second, columns=["id", "name"])
    new_rows = open_delta(table["path"], since=first, columns=["id", "name"])
    spec = {"compression": "zstd"}  # part of the source's fingerprint
    other = pa.table({"id": pa.array(range(10_000, 10_300), pa.int64()), "name": ["m"] * 300})
    write_mds(other, str(tmp_path / "mds"))
    m = mix(
        [
            Source(old, proportion=0.4),
            Source(new_rows.dataset(spec), proportion=0.3, name="new"),
            Source(str(tmp_path / "mds"), proportion=0.3),
        ]
    )
    saved = tmp_path / "mixture.json"
    m.save(str(saved))
    again = open_mixture(str(saved))
    assert again.fingerprint == m.fingerprint
    assert [d.path for d in again.sources] == [d.path for d in m.sources]
    assert again.sources[1].spec["compression"] == "zstd"
    want = _ids(m.iter_batches(64, shuffle=True, seed=3))
    assert _ids(again.iter_batches(64, shuffle=True, seed=3)) == want
    assert "delta" not in json.loads(saved.read_text())["sources"][2]  # a dataset: its path
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(saved), "--json"]) == 0
    assert [s["per_epoch"] for s in json.loads(out.getvalue())["sources"]] == m.counts


def test_saved_mixture_with_a_filtered_in_place_source_is_refused_naming_it(
    table: dict[str, Any], tmp_path: Path
) -> None:
    import pyarrow.compute as pc

    from spark_dl_core import MixtureError, open_mixture

    snap = open_delta(table["path"], columns=["id", "name"], filter=pc.field("id") > 100)
    saved = tmp_path / "mixture.json"
    mix([Source(snap, name="big")]).save(str(saved))
    with pytest.raises(MixtureError, match=r"source 0 \(big\).*filter=.*export the filtered"):
        open_mixture(str(saved))


def test_missing_or_broken_data_file_names_it(table: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(table["path"], copy)
    snap = open_delta(copy)
    assert snap.fingerprint == open_delta(table["path"]).fingerprint  # a copy is the same data
    victim = snap.files[-1]
    Path(victim).write_bytes(b"not parquet at all")
    with pytest.raises(DeltaSnapshotError, match=r"version \d+.*" + os.path.basename(victim)):
        list(snap.iter_batches(64))
    os.remove(victim)
    with pytest.raises(DeltaSnapshotError, match="missing"):
        open_delta(copy)  # checked at open, as before


def test_footer_guess_wrong_is_refused_then_overridden(tmp_path: Path) -> None:
    """Lists of lengths 1..5 in rows of 100 average exactly 3 per row: the footers suggest
    a dense (3,), the row group says otherwise; forms= reads them jagged."""
    path = str(tmp_path / "t")
    ids = np.arange(200)
    data = pa.table({"id": ids, "tok": pa.array([list(range(i % 5 + 1)) for i in ids])})
    write_deltalake(path, data, writer_properties=WriterProperties(max_row_group_size=100))
    snap = open_delta(path)
    with pytest.raises(DeltaSnapshotError, match="'tok' holds lists of other lengths"):
        list(snap.iter_batches(50))
    ds = snap.dataset(forms={"tok": "jagged"})
    assert [len(t) for b in ds.iter_batches(50) for t in b["tok"]] == [i % 5 + 1 for i in ids]


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, 48, dtype=np.float32)[None, :, None]
    pixels = np.clip(x + rng.normal(0, 20, (40, 48, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_image_ops_equal_the_export(tmp_path: Path) -> None:
    path = str(tmp_path / "img")
    n = 60
    data = pa.table({"id": pa.array(range(n), pa.int64()), "image": [_jpeg(i) for i in range(n)]})
    write_deltalake(path, data, writer_properties=WriterProperties(max_row_group_size=25))
    snap = open_delta(path)
    spec = {"columns": {"image": "jpeg"}}
    export = snap.to_dataset(str(tmp_path / "export"), spec)
    inplace = snap.dataset(spec)
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "random_resized_crop", "column": "image", "size": 16},
    ]
    # Decoded pixels: the same through both loaders (one file: a sample has one index).
    decode = {"batch_size": 8, "transforms": ops[:1]}
    got = {int(i): im for b in inplace.iter_batches(**decode) for i, im in zip(b["id"], b["image"])}
    want = {int(i): im for b in export.iter_batches(**decode) for i, im in zip(b["id"], b["image"])}
    assert got.keys() == want.keys() == set(range(n))
    assert all(np.array_equal(np.asarray(got[i]), np.asarray(want[i])) for i in range(n))
    # Random crops draw from (fingerprint, seed, epoch, sample): the in-place loader's crops
    # are the ops' crops of the export's bytes under the in-place dataset's key.
    from spark_dl_core.ops.read import ReadOps

    ids = np.arange(n)
    crops = {
        int(i): im
        for b in inplace.iter_batches(8, transforms=ops, seed=4)
        for i, im in zip(b["id"], b["image"])
    }
    raw = export.read(ids, ["id", "image"])
    same = ReadOps(inplace, ops, ["id", "image"], seed=4).apply(raw, ids)["image"]
    assert all(np.array_equal(np.asarray(crops[i]), np.asarray(same[i])) for i in range(n))
    assert np.asarray(crops[0]).shape == (16, 16, 3)


# -- the machine-local cache of converted row groups (tables/parquet/cache.py)


def _converted(run: Any) -> int:
    """Row groups this process converted while running ``run()``."""
    from spark_dl_core.tables.delta import in_place as delta_inplace

    before = delta_inplace.conversions
    run()
    return delta_inplace.conversions - before


def _cached(directory: Path) -> dict[str, int]:
    """The cache's shard files and their inodes (a conversion writes a new inode)."""
    return {p.name: p.stat().st_ino for p in directory.glob("*.mds")}


def test_second_epoch_converts_nothing(table: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ds = open_delta(table["path"]).dataset(cache_dir=str(cache))
    first: list[list[int]] = []
    assert _converted(lambda: first.append(_ids(ds.iter_batches(64, shuffle=True, seed=1))))
    assert len(_cached(cache)) == ds.num_shards
    assert _converted(lambda: first.append(_ids(ds.iter_batches(64, shuffle=True, seed=1)))) == 0
    fresh = open_delta(table["path"]).dataset(cache_dir=str(cache))  # an empty per-process LRU
    again: list[int] = []
    assert _converted(lambda: again.extend(_ids(fresh.iter_batches(64, shuffle=True, seed=1)))) == 0
    assert first[0] == first[1] == again
    assert sorted(again) == sorted(open_delta(table["path"]).to_arrow()["id"].to_pylist())


def test_workers_share_the_cache(table: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cache = tmp_path / "cache"
    ds = open_delta(table["path"]).dataset(cache_dir=str(cache))
    epochs = []
    for _ in range(2):
        loader = ds.to_torch(batch_size=64, shuffle=True, seed=5, num_workers=2)
        epochs.append(([int(i) for b in loader for i in b["id"]], _cached(cache)))
    (ids1, files1), (ids2, files2) = epochs
    assert len(files1) == ds.num_shards and files2 == files1  # the second epoch wrote nothing
    assert ids1 == ids2 == _ids(ds.iter_batches(64, shuffle=True, seed=5))


def test_another_process_reads_the_cache(table: dict[str, Any], tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    mine = open_delta(table["path"]).dataset(cache_dir=cache)
    batches = list(mine.iter_batches(50, shuffle=True, seed=11))
    code = (
        "import json,sys; from spark_dl_core.tables.delta import in_place as d; "
        "from spark_dl_core.tables.delta.table import open_delta; "
        "s=open_delta(sys.argv[1]).dataset(cache_dir=sys.argv[2]); "
        "b=[{'id':[int(i) for i in x['id']],'emb':x['emb'].tolist(),"
        "'tok':[list(map(int,t)) for t in x['tok']]} "
        "for x in s.iter_batches(50, shuffle=True, seed=11)]; "
        "print(json.dumps([d.conversions, b]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, table["path"], cache],
        capture_output=True,
        text=True,
        check=True,
    )
    conversions, theirs = json.loads(out.stdout)
    assert conversions == 0
    assert [b["id"] for b in theirs] == [b["id"].tolist() for b in batches]
    assert [b["emb"] for b in theirs] == [b["emb"].tolist() for b in batches]
    assert [b["tok"] for b in theirs] == [[list(map(int, t)) for t in b["tok"]] for b in batches]


def test_a_newer_version_reuses_unchanged_files(tmp_path: Path) -> None:
    path, cache = str(tmp_path / "t"), str(tmp_path / "cache")
    props = WriterProperties(max_row_group_size=50)
    write_deltalake(path, _data(0, 200).drop(["part"]), writer_properties=props)
    old = open_delta(path).dataset(cache_dir=cache)
    assert _converted(lambda: old.to_arrow()) == old.num_shards == 4
    write_deltalake(path, _data(200, 150).drop(["part"]), mode="append", writer_properties=props)
    new = open_delta(path).dataset(cache_dir=cache)
    got: list[Any] = []
    assert _converted(lambda: got.append(new.to_arrow())) == 3  # the new file's row groups only
    assert got[0]["id"].to_pylist() == new.snapshot.to_arrow()["id"].to_pylist()
    assert sorted(got[0]["id"].to_pylist()) == list(range(350))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_cached_row_group_is_converted_again(
    table: dict[str, Any], tmp_path: Path, damage: str
) -> None:
    cache = tmp_path / "cache"
    snap = open_delta(table["path"])
    expected = snap.dataset(cache_dir=str(cache)).to_arrow()
    files = sorted(cache.glob("*.mds"))
    for victim in files[:2]:
        data = bytearray(victim.read_bytes())
        if damage == "truncate":
            victim.write_bytes(bytes(data[: len(data) // 2]))
        else:
            data[len(data) // 3] ^= 0x10  # inside a row's values
            victim.write_bytes(bytes(data))
    fresh = open_delta(table["path"]).dataset(cache_dir=str(cache))
    got: list[Any] = []
    assert _converted(lambda: got.append(fresh.to_arrow())) == 2
    assert got[0].to_pylist() == expected.to_pylist()
    assert len(_cached(cache)) == len(files)  # rewritten whole


def test_cache_false_writes_nothing(table: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ds = open_delta(table["path"]).dataset(cache=False, cache_dir=str(cache))
    assert _converted(lambda: ds.to_arrow()) == ds.num_shards
    assert _converted(lambda: ds.to_arrow()) == ds.num_shards  # each pass converts again
    assert not cache.exists()


def test_cache_size_limit_keeps_the_newest(
    table: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    snap = open_delta(table["path"])
    expected = snap.dataset(cache=False).to_arrow().to_pylist()
    one = max(p.stat().st_size for p in _fill(snap, tmp_path / "probe"))
    monkeypatch.setenv("SPARK_DL_CACHE_BYTES", str(3 * one))
    ds = snap.dataset(cache_dir=str(cache))
    assert ds.to_arrow().to_pylist() == expected
    sizes = [p.stat().st_size for p in cache.glob("*.mds")]
    assert 1 <= len(sizes) < ds.num_shards and sum(sizes) <= 3 * one


def _fill(snap: Any, directory: Path) -> list[Path]:
    snap.dataset(cache_dir=str(directory)).to_arrow()
    return list(directory.glob("*.mds"))


def test_row_groups_load_from_several_threads_at_once(tmp_path: Path) -> None:
    """A reader's prefetch thread and the main thread convert row groups of one file at once:
    pyarrow misreads (ReadRangeCache errors) or aborts the process when two threads read one
    open ParquetFile, so each file is read by one thread at a time."""
    import threading

    path = str(tmp_path / "t")
    ids = np.arange(8000, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "x": pa.array(np.ones((8000, 8), np.float32).tolist(), pa.list_(pa.float32(), 8)),
        }
    )
    write_deltalake(path, table, writer_properties=WriterProperties(max_row_group_size=400))
    ds = open_delta(path).dataset(cache=False)
    assert ds.num_shards == 20
    want = [ds.load_shard(i).raw.tobytes() for i in range(ds.num_shards)]
    errors: list[BaseException] = []

    def load(k: int) -> None:
        try:
            for r in range(2):
                for i in range(ds.num_shards):
                    shard = (i + 3 * k + r) % ds.num_shards
                    ds._lru.clear()  # convert again, not from this process's memory
                    assert ds.load_shard(shard).raw.tobytes() == want[shard]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_fixed_width_row_group_is_converted_with_one_copy(tmp_path: Path) -> None:
    """The first shuffled batch waits for a window of row groups to be converted: a row
    group whose rows are all alike (int64 + float32[32], as Spark and deltalake write
    embeddings) is laid straight into its shard, not encoded per chunk, assembled, then
    joined (3.6x the shard's bytes in numpy buffers before; now the shard and its offsets)."""
    import tracemalloc

    path = str(tmp_path / "t")
    n = 40_000
    x = np.random.default_rng(0).random((n, 32), dtype=np.float32)
    emb = pa.array(x.tolist(), pa.list_(pa.float32()))
    table = pa.table({"id": pa.array(np.arange(n), pa.int64()), "x": emb})
    write_deltalake(path, table, writer_properties=WriterProperties(max_row_group_size=20_000))
    ds = open_delta(path).dataset(cache=False)
    ds.load_shard(1)  # first-use imports and caches out of the figure
    tracemalloc.start()
    try:
        data = ds.load_shard(0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(data.raw)
    batch = ds[0:3]
    assert batch["id"].tolist() == [0, 1, 2]
    assert np.array_equal(np.stack(list(batch["x"])), x[:3])
