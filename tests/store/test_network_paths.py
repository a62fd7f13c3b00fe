"""Local paths that are remote storage (issue 42, item 6): a path on a network or FUSE mount
is found in the mount table and read through the node cache as an ``s3://`` URL is, so a
second epoch reads local disk; ``node_cache=True`` does the same for any local path (this
machine mounts no network filesystem, so the cache path is exercised on a local directory)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.store.cached_store import CachedStore
from spark_dl_core.store.network import mounts, network_mount

pytest.importorskip("torch")

# A mountinfo table as Linux writes it (fields: id, parent, dev, root, mount point, options,
# optional fields, "-", type, source, super options), with the mounts a training node has.
MOUNTINFO = """\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
30 22 0:26 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw
41 22 0:40 / /mnt/nfs rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2
42 41 259:2 / /mnt/nfs/local rw shared:21 - ext4 /dev/nvme1n1 rw
43 22 0:41 / /Volumes rw,nosuid,nodev master:3 - fuse.dbfs dbfs rw,user_id=0
44 22 0:42 / /data/my\\040share rw - cifs //host/share rw
45 22 0:43 / /lustre rw - lustre 10.0.0.1@tcp:/fs rw
"""


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("/mnt/nfs/dataset", ("/mnt/nfs", "nfs4")),
        ("/mnt/nfs", ("/mnt/nfs", "nfs4")),
        ("/mnt/nfs/local/dataset", None),  # a local disk mounted inside the NFS mount
        ("/mnt/nfsother/x", None),  # a prefix of the name is not the mount
        ("/Volumes/main/default/vol/ds", ("/Volumes", "fuse.dbfs")),
        ("/data/my share/ds", ("/data/my share", "cifs")),
        ("/lustre/project", ("/lustre", "lustre")),
        ("/tmp/x", None),
        ("/home/user", None),
    ],
)
def test_network_mounts_are_found_by_the_longest_mount_point(
    path: str, found: tuple[str, str] | None
) -> None:
    assert network_mount(path, MOUNTINFO) == found


def test_this_machines_mount_table_reads() -> None:
    """The real table parses, and the test's own temp directory is local here."""
    table = Path("/proc/self/mountinfo").read_text()
    assert any(point == "/" for point, _ in mounts(table))
    assert network_mount(os.getcwd()) is None


def _rows(n: int) -> pa.Table:
    return pa.table({"id": np.arange(n, dtype=np.int64), "v": np.ones((n, 8), np.float32).tolist()})


def test_node_cache_copies_a_local_path_once(tmp_path: Path) -> None:
    """node_cache=True: the first epoch copies the shards to the node cache (verified), the
    second reads only the cache; the rows are the dataset's, as read in place. The default
    reads this local directory in place."""
    path = str(tmp_path / "ds")
    write_mds(_rows(3000), path, DatasetSpec(shard_size="8KiB", hashes=["xxh64"]))
    stored = sum(f.stat().st_size for f in Path(path).glob("*.mds"))
    assert not isinstance(open_dataset(path).store, CachedStore)
    assert open_dataset(path).download_stats() is None
    ds = open_dataset(path, node_cache=True, cache_dir=str(tmp_path / "node"))
    assert isinstance(ds.store, CachedStore)
    loader = ds.to_torch(batch_size=100, shuffle=True, seed=2, columns=["id"])
    first = sorted(i for b in loader for i in b["id"].tolist())
    assert first == list(range(3000))
    assert loader.stats()["download_bytes"] == stored
    loader.set_epoch(1)
    second = sorted(i for b in loader for i in b["id"].tolist())
    stats = loader.stats()
    assert second == first and stats["download_bytes"] == 0 and stats["cache_hit_bytes"] > 0
    cached = list((tmp_path / "node").rglob("*.mds"))
    assert len(cached) == ds.num_shards
    assert not isinstance(open_dataset(path, node_cache=False).store, CachedStore)


def test_each_rank_copies_only_its_share(tmp_path: Path) -> None:
    """Two ranks, each its own node cache: each copies about half of the shards (its
    streams'), and together they read every row once."""
    path = str(tmp_path / "ds")
    write_mds(_rows(6000), path, DatasetSpec(shard_size="4KiB"))
    stored = sum(f.stat().st_size for f in Path(path).glob("*.mds"))
    seen, pulled = [], []
    for rank in range(2):
        ds = open_dataset(path, node_cache=True, cache_dir=str(tmp_path / f"node{rank}"))
        assert ds.num_shards >= 32  # the default order reads several streams
        kw = {"shuffle": True, "seed": 5, "rank": rank, "world_size": 2, "columns": ["id"]}
        loader = ds.to_torch(batch_size=50, even_batches=False, **kw)
        seen += [i for b in loader for i in b["id"].tolist()]
        pulled.append(loader.stats()["download_bytes"])
    assert sorted(seen) == list(range(6000))
    assert all(p <= 0.6 * stored for p in pulled) and sum(pulled) <= 1.1 * stored


def test_a_cache_dir_holding_another_datasets_shards_is_refused(tmp_path: Path) -> None:
    """Two datasets name their shards alike (``shard.00000.mds``): a second dataset given the
    first one's ``cache_dir`` was served its bytes (a HashMismatchError blaming the shard, or
    wrong rows where the index holds no hashes). It is refused at open, naming both; the same
    dataset opened again, by any process, reads on from the same directory."""
    from spark_dl_core.errors import SpecError
    from spark_dl_core.store.cached_store import claim_cache_dir

    for name, first in (("a", 0), ("b", 1000)):  # same shard names, sizes and row count
        table = pa.table({"id": np.arange(first, first + 500, dtype=np.int64)})
        write_mds(table, str(tmp_path / name), DatasetSpec(shard_size="2KiB"))
    cache = str(tmp_path / "cache")
    a = open_dataset(str(tmp_path / "a"), node_cache=True, cache_dir=cache)
    assert sorted(i for b in a.iter_batches(100) for i in b["id"].tolist()) == list(range(500))
    with pytest.raises(SpecError, match=r"holds the shards of .*/a'.*not .*/b'"):
        open_dataset(str(tmp_path / "b"), node_cache=True, cache_dir=cache)
    again = open_dataset(str(tmp_path / "a") + "/", node_cache=True, cache_dir=cache)
    assert len(list(again.iter_batches(100))) == 5
    own = open_dataset(str(tmp_path / "b"), node_cache=True, cache_dir=str(tmp_path / "cb"))
    assert sorted(i for b in own.iter_batches(100) for i in b["id"].tolist())[0] == 1000
    # processes racing for a fresh directory: exactly one dataset's claim holds
    from concurrent.futures import ThreadPoolExecutor

    fresh = str(tmp_path / "race")

    def claim(k: int) -> bool:
        try:
            claim_cache_dir(fresh, f"s3://bucket/ds{k % 2}")
            return True
        except SpecError:
            return False

    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(claim, range(16)))
    assert sum(won) == 8 and len({k % 2 for k in range(16) if won[k]}) == 1
    assert sorted(os.listdir(fresh)) == [".dataset"]


@contextlib.contextmanager
def _fuse(source: Path, mount: Path, tmp_path: Path) -> Iterator[None]:
    """``source`` served at the directory ``mount`` by a real read-only FUSE daemon
    (tests/store/fuse_passthrough.py) while inside; skipped, saying why, where the machine
    has no libfuse3 (make fuse-env), no /dev/fuse, or refuses the mount."""
    if shutil.which("fusermount3") is None:
        pytest.skip("no fusermount3: libfuse3 is not installed (make fuse-env installs fuse3)")
    pytest.importorskip("mfusepy", reason="mfusepy (a dev dependency) is not installed")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine: FUSE filesystems cannot be mounted")
    daemon = Path(__file__).with_name("fuse_passthrough.py")
    log = (tmp_path / "fuse.log").open("w")
    proc = subprocess.Popen([sys.executable, str(daemon), str(source), str(mount)], stderr=log)
    deadline = time.monotonic() + 20
    while network_mount(str(mount)) is None and proc.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if network_mount(str(mount)) is None:
        proc.kill()
        said = (tmp_path / "fuse.log").read_text()[-500:]
        pytest.skip(f"the FUSE mount was refused here: {said}")
    try:
        yield
    finally:  # lazily: a dataset object of the test may still map a file there
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False, capture_output=True)
        try:  # the daemon ends once the test's mapped files are let go; do not wait for it
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def fuse_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A directory and its read-only FUSE passthrough, mounted for the test."""
    source, mount = tmp_path / "source", tmp_path / "mount"
    source.mkdir()
    mount.mkdir()
    with _fuse(source, mount, tmp_path):
        yield source, mount


def test_a_dataset_on_a_fuse_mount_is_read_through_the_node_cache(
    fuse_mount: tuple[Path, Path], tmp_path: Path
) -> None:
    """A real FUSE mount (every read through the daemon): open_dataset finds it in the mount
    table and, with no option, reads through the node cache: the first epoch copies the
    stored bytes once, the second reads local disk; the rows are the dataset's."""
    source, mount = fuse_mount
    write_mds(_rows(2000), str(source / "ds"), DatasetSpec(shard_size="8KiB"))
    stored = sum(f.stat().st_size for f in (source / "ds").glob("*.mds"))
    point, fstype = network_mount(str(mount / "ds")) or ("", "")
    assert point == str(mount) and fstype.startswith("fuse")
    ds = open_dataset(str(mount / "ds"), cache_dir=str(tmp_path / "node"))
    assert isinstance(ds.store, CachedStore)
    loader = ds.to_torch(batch_size=100, shuffle=True, seed=1, columns=["id"])
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(2000))
    assert loader.stats()["download_bytes"] == stored
    loader.set_epoch(1)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(2000))
    assert loader.stats()["download_bytes"] == 0
    assert not isinstance(open_dataset(str(mount / "ds"), node_cache=False).store, CachedStore)


def _delta(path: Path, n: int) -> int:
    """A Delta table of ``n`` rows in 4 files of several row groups; its data files' bytes."""
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=250)
    for part in np.array_split(np.arange(n, dtype=np.int64), 4):
        v = np.random.default_rng(len(part)).random((len(part), 32), dtype=np.float32)
        table = pa.table({"id": part, "v": list(v)})
        write_deltalake(str(path), table, mode="append", writer_properties=props)
    return sum(f.stat().st_size for f in path.glob("*.parquet"))


def test_a_delta_table_on_a_fuse_mount_is_read_through_the_node_cache(
    fuse_mount: tuple[Path, Path], tmp_path: Path
) -> None:
    """A Delta table read in place from a real FUSE mount goes through the span cache, as
    an ``s3://`` table does, with no option: the first epoch copies its row groups (and
    footers) once, the second reads local disk; ``node_cache=False`` reads it in place."""
    pytest.importorskip("deltalake")
    from spark_dl_core import open_delta

    source, mount = fuse_mount
    stored = _delta(source / "t", 2000)
    _two_epochs_through_spans(open_delta(str(mount / "t")), 2000, stored, tmp_path / "spans")


def _two_epochs_through_spans(snap: Any, rows: int, stored: int, spans: Path) -> None:
    """A table snapshot on a network mount, read in place with no option: through the span
    cache, its first epoch copying its row groups and footers once, its second reading local
    disk, every row once an epoch; ``node_cache=False`` reads it in place."""
    ds = snap.dataset(cache=False, span_dir=str(spans), plan_cache=False)
    assert ds.through_spans
    loader = ds.to_torch(batch_size=100, shuffle=True, seed=1, columns=["id"])
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(rows))
    first = loader.stats()["download_bytes"]
    assert 0 < first <= 1.1 * stored  # its row groups and footers, once
    loader.set_epoch(1)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(rows))
    assert loader.stats()["download_bytes"] == 0  # the second epoch reads local disk
    assert not snap.dataset(cache=False, node_cache=False, plan_cache=False).through_spans


def test_each_rank_of_a_local_delta_table_copies_only_its_share(tmp_path: Path) -> None:
    """``node_cache=True`` on a local Delta table: two ranks, each its own span cache, each
    copy about half of the row groups, and together read every row once."""
    pytest.importorskip("deltalake")
    from spark_dl_core import open_delta

    stored = _delta(tmp_path / "t", 8000)  # 32 row groups: the default order has streams
    assert not open_delta(str(tmp_path / "t")).dataset(cache=False).through_spans
    seen, pulled = [], []
    for rank in range(2):
        ds = open_delta(str(tmp_path / "t")).dataset(
            cache=False, node_cache=True, span_dir=str(tmp_path / f"node{rank}"), plan_cache=False
        )
        kw = {"shuffle": True, "seed": 5, "rank": rank, "world_size": 2, "columns": ["id", "v"]}
        loader = ds.to_torch(batch_size=50, even_batches=False, **kw)
        seen += [i for b in loader for i in b["id"].tolist()]
        pulled.append(loader.stats()["download_bytes"])
    assert sorted(seen) == list(range(8000))
    assert all(p <= 0.6 * stored for p in pulled) and sum(pulled) <= 1.1 * stored, pulled


def _iceberg(where: Path) -> tuple[Any, int]:
    """A PyIceberg table ``db.t`` of 8,000 rows (``v`` float32 lists of 32) in 4 appends of
    250-row row groups under ``where`` (its SQL catalog too); its data files' bytes."""
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("t", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}")
    cat.create_namespace("db")
    v = np.random.default_rng(0).random((8000, 32), dtype=np.float32)
    data = pa.table(
        {"id": np.arange(8000, dtype=np.int64), "v": pa.array(list(v), pa.list_(pa.float32()))}
    )
    props = {"write.parquet.row-group-limit": "250"}
    table = cat.create_table("db.t", data.schema, properties=props)
    for part in range(4):
        table.append(data.slice(part * 2000, 2000))
    files = list(where.rglob("*.parquet"))
    assert sum(pq.ParquetFile(f).num_row_groups for f in files) == 32
    return cat, sum(f.stat().st_size for f in files)


def test_an_iceberg_table_on_a_fuse_mount_is_read_through_the_node_cache(
    tmp_path: Path,
) -> None:
    """An Iceberg table whose metadata and data files all lie on a real FUSE mount (written
    where the mount point is, then served from elsewhere through the daemon) goes through
    the span cache with no option, as an ``s3://`` table does: the first epoch copies its
    row groups once, the second reads local disk; ``node_cache=False`` reads it in place."""
    pytest.importorskip("pyiceberg")
    from spark_dl_core import open_iceberg

    source, mount = tmp_path / "source", tmp_path / "mount"
    mount.mkdir()
    cat, stored = _iceberg(mount)  # every path in its metadata is under the mount point
    mount.rename(source)
    mount.mkdir()
    with _fuse(source, mount, tmp_path):
        snap = open_iceberg("db.t", catalog=cat)
        _two_epochs_through_spans(snap, 8000, stored, tmp_path / "spans")


def test_each_rank_of_a_local_iceberg_table_copies_only_its_share(tmp_path: Path) -> None:
    """``node_cache=True`` on a local Iceberg table: two ranks, each its own span cache, each
    copies about half of the row groups in its first epoch and nothing in its second, and
    together they read every row once an epoch."""
    pytest.importorskip("pyiceberg")
    from spark_dl_core import open_iceberg

    (tmp_path / "warehouse").mkdir()
    cat, stored = _iceberg(tmp_path / "warehouse")
    assert not open_iceberg("db.t", catalog=cat).dataset(cache=False).through_spans
    seen, seen_again, pulled = [], [], []
    for rank in range(2):
        ds = open_iceberg("db.t", catalog=cat).dataset(
            cache=False, node_cache=True, span_dir=str(tmp_path / f"node{rank}"), plan_cache=False
        )
        kw = {"shuffle": True, "seed": 5, "rank": rank, "world_size": 2, "columns": ["id", "v"]}
        loader = ds.to_torch(batch_size=50, even_batches=False, **kw)
        seen += [i for b in loader for i in b["id"].tolist()]
        pulled.append(loader.stats()["download_bytes"])
        loader.set_epoch(1)
        seen_again += [i for b in loader for i in b["id"].tolist()]
        assert loader.stats()["download_bytes"] == 0  # the second epoch reads local disk
    assert sorted(seen) == sorted(seen_again) == list(range(8000))
    assert all(0 < p <= 0.6 * stored for p in pulled) and sum(pulled) <= 1.1 * stored, pulled
