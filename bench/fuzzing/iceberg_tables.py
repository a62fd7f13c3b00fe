"""The Iceberg target family: small v2 tables written by PyIceberg (a SQL catalog over
sqlite) with appends, merge-on-read position deletes, equality deletes, a schema change and
an identity partition; the kinds of corruption that a metadata file, an Avro manifest (list)
and a Parquet footer add to the plain ones; and the cases planned over a table's files.

An Iceberg table names its files by absolute path (metadata JSON, Avro manifests, position
delete files), so a copy still points at the original: a case mutates the one pristine table
in place, under a lock on it, and puts the file back from a copy after the read (a worker
that died mid-case leaves a marker, and the next one to take the lock restores the table).
v3 deletion vectors (Puffin) are not fuzzed here: PyIceberg 0.12 reads them but does not
write them (the Spark tests cover Spark-written ones)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.fuzzing.delta_tables import mutate_delta
from bench.fuzzing.mutations import KINDS

ICEBERG_KINDS = (*KINDS, "footer", "avro_body")
ROWS = 60


def _rows(start: int, n: int, extra: bool = False) -> Any:
    import numpy as np
    import pyarrow as pa

    ids = np.arange(start, start + n)
    cols: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        "vec": pa.array([[float(i), i / 2] for i in ids], pa.list_(pa.float32())),
        "name": [f"row {i}" for i in ids],
        "part": ["ab"[i % 2] for i in ids],
    }
    if extra:
        cols["score"] = pa.array(ids / 4.0, pa.float64())
    return pa.table(cols)


def build_iceberg_tables(root: Path) -> dict[str, Path]:
    """``ice-pos``: identity-partitioned on ``part``, two appends each followed by a
    position-delete file per partition, a column added, a third append. ``ice-eq``:
    unpartitioned, an append, a position delete, an equality delete on ``id``, an append.
    Row groups of 16 rows. Beside each table: ``<name>.pin.json`` (its current metadata file
    and snapshot, what every case reads pinned) and ``<name>.orig`` (a byte copy)."""
    import pyarrow.parquet as pq
    from pyiceberg.types import DoubleType

    from tests.sources.iceberg_helpers import catalog, equality_deletes, position_deletes

    props = {"write.parquet.row-group-limit": "16"}
    cat = catalog(root / "warehouse")
    out: dict[str, Path] = {}

    def positions(t: Any, ids: set[int]) -> list[dict[str, list[int]]]:
        per: dict[str, dict[str, list[int]]] = {}
        for task in t.scan().plan_files():
            got = pq.read_table(task.file.file_path[len("file://") :], columns=["id"])
            hit = [k for k, i in enumerate(got["id"].to_pylist()) if i in ids]
            if hit:
                per.setdefault(str(task.file.partition), {})[task.file.file_path] = hit
        return list(per.values())

    t = cat.create_table("db.pos", schema=_rows(0, 1).schema, properties=props)
    with t.update_spec() as spec:
        spec.add_identity("part")
    for k in range(2):
        t = cat.load_table("db.pos")
        t.append(_rows(k * ROWS, ROWS))
        t = cat.load_table("db.pos")
        for rows in positions(t, {k * ROWS + d for d in (0, 3, 17, 40)}):
            position_deletes(t, rows)
    t = cat.load_table("db.pos")
    with t.update_schema() as update:
        update.add_column("score", DoubleType())
    t = cat.load_table("db.pos")
    t.append(_rows(500, 20, extra=True).cast(t.schema().as_arrow()))
    out["ice-pos"] = _finish(root, "ice-pos", cat.load_table("db.pos"))

    e = cat.create_table("db.eq", schema=_rows(0, 1).schema, properties=props)
    e.append(_rows(0, ROWS))
    import pyarrow as pa

    e = cat.load_table("db.eq")
    for rows in positions(e, {5, 20}):  # first: PyIceberg plans no table with equality deletes
        position_deletes(e, rows)
    equality_deletes(cat.load_table("db.eq"), pa.table({"id": pa.array([2, 9, 33], pa.int64())}))
    e = cat.load_table("db.eq")
    e.append(_rows(1000, 10))
    out["ice-eq"] = _finish(root, "ice-eq", cat.load_table("db.eq"))
    return out


def _finish(root: Path, name: str, table: Any) -> Path:
    path = Path(table.metadata.location[len("file://") :])
    pin = {
        "metadata": str(table.metadata_location),
        "snapshot_id": table.current_snapshot().snapshot_id,
    }
    Path(f"{path}.pin.json").write_text(json.dumps(pin))
    shutil.copytree(path, f"{path}.orig", copy_function=shutil.copy2)
    return path


def pin_of(path: str) -> dict[str, Any]:
    """The pristine table's metadata file and snapshot (what each case reads)."""
    return json.loads(Path(f"{path}.pin.json").read_text())  # type: ignore[no-any-return]


def iceberg_files(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def mutate_iceberg(data: bytes, kind: str, rng: random.Random, name: str) -> bytes | None:
    """:func:`mutate_delta` (the plain kinds, JSON values, Parquet footers), and
    ``avro_body``: bytes flipped past an Avro file's header (in its data blocks)."""
    if kind == "avro_body" and name.endswith(".avro") and len(data) > 64:
        buf = bytearray(data)
        start = len(buf) // 2
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(start, len(buf))] = rng.randrange(256)
        return bytes(buf)
    if kind == "avro_body":
        kind = "flip"
    return mutate_delta(data, kind, rng, name)


@contextlib.contextmanager
def mutated_in_place(table: Path, rel: str, mutated: bytes | None) -> Iterator[None]:
    """The table with ``rel`` replaced by ``mutated`` (None: removed), for as long as the
    block runs, under the table's lock; put back from ``<table>.orig`` after."""
    orig = Path(f"{table}.orig")
    marker = Path(f"{table}.dirty")
    with locked(table):
        victim = table / rel
        marker.write_text(rel)
        try:
            if mutated is None:
                victim.unlink()
            else:
                victim.write_bytes(mutated)
            yield
        finally:
            shutil.copy2(orig / rel, victim)
            marker.unlink()


@contextlib.contextmanager
def locked(table: Path) -> Iterator[None]:
    """The table to this process alone, as built (a worker that died mid-case left it
    mutated and a marker: the whole table is put back first)."""
    marker = Path(f"{table}.dirty")
    with open(f"{table}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if marker.exists():
                shutil.rmtree(table)
                shutil.copytree(f"{table}.orig", table, copy_function=shutil.copy2)
                marker.unlink()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def plan_iceberg_cases(
    tables: dict[str, Path], count: int, seed: int, targets: list[str]
) -> list[dict[str, Any]]:
    """``count`` cases over Iceberg tables: metadata (JSON, manifest lists, manifests) and
    delete files get most of them, the data files the rest; each read by one of ``targets``."""
    rng = random.Random(seed)
    files = {name: iceberg_files(path) for name, path in tables.items()}
    cases = []
    for i in range(count):
        name = rng.choice(sorted(tables))
        meta = [f for f in files[name] if f.startswith("metadata/") or "delete-" in f]
        data = [f for f in files[name] if f not in meta]
        victim = rng.choice(meta if rng.random() < 0.65 else data)
        kinds = [k for k in ICEBERG_KINDS if not k.startswith("json_") or victim.endswith(".json")]
        cases.append(
            {
                "id": i,
                "dataset": name,
                "file": victim,
                "kind": rng.choice(kinds),
                "seed": rng.getrandbits(32),
                "target": targets[i % len(targets)],
            }
        )
    return cases
