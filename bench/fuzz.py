"""Fuzz harness: randomly corrupted copies of small datasets, read as a user would.

Every file of a dataset is mutated (byte flips, bit flips, truncation, insertions,
deletions, JSON values of other types, removed keys, removed or emptied files) across
datasets of every encoding family, raw and zstd shards, with and without the compact
index. Each case is read in a worker subprocess under a memory limit; the parent gives
each case a timeout, so a crash (signal) or a hang is counted instead of ending the run.
Workers take many cases each; a case whose worker dies or stalls is run again alone to
confirm it. Outcome classes:

- ``same``: read in full, equal to the original (values, columns, length, fingerprint);
- ``typed``: a ``SparkDLError`` naming the mutated file (``typed_unnamed``: not naming it);
- ``no_metadata``: read in full as a dataset without spark-dl metadata, after
  ``spark_dl.json`` was removed from a dataset that has no compact index either (nothing
  records that it had one: it is a valid dataset as another MDS writer would write it);
- ``unchecked``: other values read from a Delta data file whose bytes changed in place
  (same size, magics intact) and still parse: Parquet as deltalake writes it has no page
  checksums, and Delta records no hash of a data file, so no reader can tell;
- ``untyped``: any other exception; ``different``: read in full, not equal to the original;
- ``crash``: the process died (signal or exit); ``hang``: no answer within the timeout.

``python bench/fuzz.py --cases 100000`` (``make fuzz``) prints the counts; ``--targets``
adds the CLI (``cli-inspect``, ``cli-verify``) and ``spark-read`` (a local Spark session per
worker: slow, for a few cases) beside the plain ``read``; ``--json`` prints them as JSON.
The exit status is 1 when any case ended untyped, different, crashed or hung.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.delta_helpers
from tests.delta_helpers import roaring64

BAD = ("untyped", "different", "crash", "hang")
OUTCOMES = ("same", "typed", "typed_unnamed", "no_metadata", "unchecked", *BAD)
METADATA = ("index.json", "spark_dl.json", "spark_dl.index.arrow")
META_FILE = METADATA[1]
KINDS = (
    "flip",
    "bit",
    "truncate",
    "insert",
    "delete",
    "json_type",
    "json_number",
    "json_key",
    "remove",
    "empty",
)
MEMORY_LIMIT = 3 << 30  # a case allocating beyond this fails (MemoryError: untyped)


# --------------------------------------------------------------------------- datasets


def _png(i: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4 + i % 3, 3), (i * 7 % 256, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _jpeg(i: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 8 + i % 4), (0, i * 5 % 256, 9)).save(out, format="JPEG")
    return out.getvalue()


def _tables() -> dict[str, tuple[Any, dict[str, str]]]:
    """Two tables covering the encoding families, with the spec's column encodings."""
    import decimal

    import numpy as np
    import pyarrow as pa

    n = 40
    mixed = pa.table(
        {
            "i8": pa.array(np.arange(n) % 100, pa.int8()),
            "u16": pa.array(np.arange(n) * 3, pa.uint16()),
            "i64": pa.array(np.arange(n) * 1_000_003, pa.int64()),
            "u64": pa.array(np.arange(n), pa.uint64()),
            "f16": pa.array(np.arange(n) / 4, pa.float16()),
            "f64": pa.array(np.arange(n) / 3, pa.float64()),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "text": [f"row {i} " * (i % 4) for i in range(n)],
            "maybe": pa.array([None if i % 5 == 0 else f"m{i}" for i in range(n)]),
            "blob": pa.array([bytes([i]) * (i % 6) for i in range(n)], pa.binary()),
            "vec": pa.array([[float(i), 1.0, 2.0] for i in range(n)], pa.list_(pa.float32(), 3)),
            "tokens": pa.array([list(range(i % 9)) for i in range(n)], pa.list_(pa.int16())),
            "dense": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32())),
            "any": pa.array([[float(i)] * (i % 3 + 1) for i in range(n)], pa.list_(pa.float64())),
            "ts": pa.array(np.arange(n) * 10**9, pa.timestamp("ns")),
            "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(8, 2)),
            "si": pa.array(np.arange(n) - 7, pa.int64()),
            "sf": pa.array(np.arange(n) * 0.5, pa.float64()),
            "meta": [{"k": i, "v": [i] * (i % 3)} for i in range(n)],
        }
    )
    mixed_columns = {"any": "ndarray", "si": "str_int", "sf": "str_float", "u64": "uint64"}
    media = pa.table(
        {
            "id": pa.array(np.arange(n), pa.int32()),
            "png": pa.array([_png(i) for i in range(n)], pa.binary()),
            "jpeg": pa.array([_jpeg(i) for i in range(n)], pa.binary()),
            "caption": [f"image {i}" for i in range(n)],
        }
    )
    return {
        "mixed": (mixed, mixed_columns),
        "media": (media, {"png": "png", "jpeg": "jpeg"}),
    }


def build_datasets(root: Path) -> dict[str, Path]:
    """Pristine datasets: each table, raw and zstd shards, with and without the compact
    index (raw ones record content hashes only, zstd ones xxh64 file hashes as well)."""
    from spark_dl_core import DatasetSpec, write_mds
    from spark_dl_core.format.compact import COMPACT_FILE

    out: dict[str, Path] = {}
    for table_name, (table, columns) in _tables().items():
        for compression in (None, "zstd"):
            for compact in (True, False):
                name = f"{table_name}-{compression or 'raw'}-{'compact' if compact else 'json'}"
                spec = DatasetSpec(
                    shard_size="3KiB" if table_name == "mixed" else "8KiB",
                    compression=compression,
                    hashes=["xxh64"] if compression else [],
                    nulls="mask",
                    columns=columns,
                )
                path = root / name
                write_mds(table, str(path), spec)
                if not compact:
                    (path / COMPACT_FILE).unlink()
                out[name] = path
    return out


# --------------------------------------------------------------------------- Delta tables

DELTA_TARGETS = ("delta-export", "delta-inplace")
DELTA_KINDS = (*KINDS, "footer", "json_dv", "json_line")
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"


def inline_dv(rows: list[int]) -> dict[str, Any]:
    """An inline deletion vector (``storageType`` ``i``): the bitmap Z85-encoded in the log."""
    import base64

    blob = roaring64(rows)
    padded = blob + b"\0" * (-len(blob) % 4)
    text = base64.b85encode(padded).decode().translate(str.maketrans(_B85, _Z85))
    return {
        "storageType": "i",
        "pathOrInlineDv": text,
        "sizeInBytes": len(blob),
        "cardinality": len(rows),
    }


def dv_file(table: str, deletions: list[list[int]]) -> list[dict[str, Any]]:
    """One on-disk deletion-vector file holding several vectors (as delta-spark packs them):
    version byte, then per vector its size, bitmap and CRC-32 (big-endian); their
    descriptors (``storageType`` ``u``: the file's UUID, Z85-encoded, relative to the table)."""
    import base64
    import struct
    import uuid
    import zlib

    out, descriptors = bytearray(b"\x01"), []
    for rows in deletions:
        blob = roaring64(rows)
        descriptors.append(
            {
                "storageType": "u",
                "offset": len(out),
                "sizeInBytes": len(blob),
                "cardinality": len(rows),
            }
        )
        out += struct.pack(">i", len(blob)) + blob + struct.pack(">I", zlib.crc32(blob))
    name = uuid.uuid4()
    Path(table, f"deletion_vector_{name}.bin").write_bytes(bytes(out))
    encoded = base64.b85encode(name.bytes).decode().translate(str.maketrans(_B85, _Z85))
    return [dict(d, pathOrInlineDv=encoded) for d in descriptors]


def commit_deletion_vectors(table: str, dvs: dict[str, dict[str, Any]]) -> None:
    """Commit ``dvs`` (data file path -> descriptor) as a DELETE that keeps the files:
    what delta-spark writes (deltalake's own ``delete`` rewrites files instead)."""
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    version = dt.version()
    adds = {a["path"]: a for a in _log_adds(table)}
    ts = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": ts, "operation": "DELETE"}}]
    for path, dv in dvs.items():
        add = adds[path]
        actions.append(
            {
                "remove": {
                    "path": path,
                    "deletionTimestamp": ts,
                    "dataChange": True,
                    "size": add["size"],
                    "partitionValues": add["partitionValues"],
                }
            }
        )
        actions.append({"add": dict(add, deletionVector=dv, dataChange=True)})
    log = Path(table, "_delta_log", f"{version + 1:020}.json")
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _log_adds(table: str) -> list[dict[str, Any]]:
    """Every add action of the JSON commits, in commit order (later ones win by path)."""
    adds = []
    for commit in sorted(Path(table, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if line.strip() and "add" in json.loads(line):
                adds.append(json.loads(line)["add"])
    return adds


def _delta_rows(start: int, n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "vec": pa.array([[float(i), i / 2] for i in ids], pa.list_(pa.float32())),
            "name": [f"row {i}" for i in ids],
            "part": ["ab"[i % 2] for i in ids],
        }
    )


def build_delta_tables(root: Path) -> dict[str, Path]:
    """Small tables written by deltalake: three appends of two partition files each, row
    groups of 16 rows; deletion vectors on four files (two in one on-disk file, two
    inline). ``delta-ckpt`` is then checkpointed (``create_checkpoint``) and appended once
    more, so its log is a checkpoint parquet, ``_last_checkpoint`` and a JSON commit."""
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    out: dict[str, Path] = {}
    for name in ("delta-dv", "delta-ckpt"):
        path = root / name
        for k in range(3):
            write_deltalake(
                str(path),
                _delta_rows(k * 40, 40),
                mode="append",
                partition_by=["part"],
                writer_properties=WriterProperties(max_row_group_size=16),
                configuration={"delta.enableDeletionVectors": "true"} if k == 0 else None,
            )
        files = sorted(a["path"] for a in _log_adds(str(path)))
        on_disk = dv_file(str(path), [[0, 3, 17], [5]])
        dvs = {files[0]: on_disk[0], files[1]: on_disk[1]}
        dvs |= {files[2]: inline_dv([1, 2, 19]), files[3]: inline_dv([0])}
        commit_deletion_vectors(str(path), dvs)
        if name == "delta-ckpt":
            DeltaTable(str(path)).create_checkpoint()
            write_deltalake(str(path), _delta_rows(500, 10), mode="append")
        out[name] = path
    return out


def delta_files(path: Path) -> list[str]:
    """A table's files, relative to it: the log's, the deletion vectors', the data's."""
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def mutate_delta(data: bytes, kind: str, rng: random.Random, name: str) -> bytes | None:
    """:func:`mutate`, and kinds for a Delta table's files: ``json_line`` / ``json_dv``
    change a value in one action of a commit (any, or a deletion vector's descriptor),
    keeping it one JSON object per line; ``footer`` flips bytes of a Parquet footer."""
    lines = data.decode(errors="replace").splitlines() if name.endswith(".json") else []
    if kind in ("json_line", "json_dv") and len(lines) > 1:
        at = [i for i, line in enumerate(lines) if kind == "json_line" or "deletionVector" in line]
        i = rng.choice(at or range(len(lines)))
        obj = json.loads(lines[i])
        nodes = [n for n in _json_nodes(obj)[1:] if kind == "json_line" or "deletionVector" in n]
        target = rng.choice(nodes or [()])
        if rng.random() < 0.3 and target:
            obj = _set(obj, target, None, delete=True)
        else:
            value = _get(obj, target) if target else None
            if isinstance(value, str) and value and rng.random() < 0.5:
                chars = list(value)
                chars[rng.randrange(len(chars))] = rng.choice(_Z85)
                new: Any = "".join(chars)
            elif isinstance(value, int) and not isinstance(value, bool):
                new = value + rng.choice([-1, 1, 8, -(2**31), 2**40])
            else:
                new = rng.choice(_OTHER_VALUES)
            obj = _set(obj, target, new)
        lines[i] = json.dumps(obj)
        return ("\n".join(lines) + "\n").encode()
    if kind == "footer" and name.endswith(".parquet") and len(data) > 12:
        import struct

        footer = min(struct.unpack("<I", data[-8:-4])[0] + 8, len(data))
        buf = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            buf[len(buf) - 1 - rng.randrange(footer)] = rng.randrange(256)
        return bytes(buf)
    if kind in ("footer", "json_dv", "json_line"):
        kind = "flip"
    return mutate(data, kind, rng)


def delta_snapshot(path: str, target: str, version: int | None = None) -> str:
    """A digest of what a reader of the table at ``version`` gets: the exported rows
    (``delta-export``: ``to_arrow``, the rows ``write_mds`` writes) or the batches read in
    place (``delta-inplace``: shuffled, no converted-row-group cache)."""
    from spark_dl_core.tables.delta.table import open_delta

    snap = open_delta(path, version=version)
    if target == "delta-export":
        table = snap.to_arrow()
        text = repr((snap.version, table.schema, table.to_pylist()))
        return hashlib.sha256(text.encode()).hexdigest()
    ds = snap.dataset(cache=False)
    h = hashlib.sha256(repr((snap.version, len(ds), ds.columns)).encode())
    for batch in ds.iter_batches(batch_size=16, shuffle=True, seed=3):
        for name in sorted(batch):
            h.update(name.encode())
            _canon(batch[name], h)
    return h.hexdigest()


# --------------------------------------------------------------------------- mutations


def _json_nodes(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    nodes = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            nodes += _json_nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            nodes += _json_nodes(v, (*path, i))
    return nodes


def _set(obj: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


_OTHER_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    7,
    2**31,
    2**63,
    10**30,
    1.5,
    float("nan"),
    "",
    "x",
    "../../etc/passwd",
    [],
    [1, "a"],
    {},
    {"a": 1},
]


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes | None:
    """``data`` mutated by ``kind`` (None: remove the file)."""
    if kind == "remove":
        return None
    if kind == "empty":
        return b""
    if kind.startswith("json_"):
        try:
            obj = json.loads(data)
        except ValueError:
            kind = "flip"
        else:
            nodes = _json_nodes(obj)
            target = rng.choice(nodes[1:] or nodes)
            if kind == "json_key" and target:
                obj = _set(obj, target, None, delete=True)
            elif kind == "json_number":
                value: Any = rng.choice([0, -1, 1, 2**31, 2**62, 2**64, -(2**63), 3])
                numbers = [p for p in nodes if type(_get(obj, p)) is int]
                if numbers:
                    target = rng.choice(numbers)
                    value = rng.choice([_get(obj, target) + rng.choice([-1, 1]), value])
                obj = _set(obj, target, value)
            else:
                obj = _set(obj, target, rng.choice(_OTHER_VALUES))
            return json.dumps(obj, indent=1, sort_keys=rng.random() < 0.5).encode()
    buf = bytearray(data)
    if not buf and kind != "insert":
        return bytes(rng.randbytes(rng.randint(1, 16)))
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "bit":
        at = rng.randrange(len(buf))
        buf[at] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf)) :]
    elif kind == "insert":
        at = rng.randint(0, len(buf))
        buf[at:at] = rng.randbytes(rng.randint(1, 16))
    elif kind == "delete":
        at = rng.randrange(len(buf))
        del buf[at : at + rng.randint(1, 64)]
    return bytes(buf)


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def plan_cases(
    datasets: dict[str, Path], count: int, seed: int, targets: list[str]
) -> list[dict[str, Any]]:
    """``count`` cases, reproducible from ``seed``: metadata files get most of them (they
    are few and parsed first), shards the rest."""
    rng = random.Random(seed)
    files = {
        name: sorted(p.name for p in path.iterdir() if p.is_file())
        for name, path in datasets.items()
    }
    cases = []
    for i in range(count):
        name = rng.choice(sorted(datasets))
        meta = [f for f in files[name] if f in METADATA]
        shards = [f for f in files[name] if f not in METADATA]
        file = rng.choice(meta if rng.random() < 0.7 else shards)
        cases.append(
            {
                "id": i,
                "dataset": name,
                "file": file,
                "kind": rng.choice(KINDS),
                "seed": rng.getrandbits(32),
                "target": targets[i % len(targets)],
            }
        )
    return cases


def plan_delta_cases(
    tables: dict[str, Path], count: int, seed: int, targets: list[str]
) -> list[dict[str, Any]]:
    """``count`` cases over Delta tables: the log and deletion vectors get most of them,
    the Parquet data files the rest; each read by one of ``targets`` (both paths)."""
    rng = random.Random(seed)
    files = {name: delta_files(path) for name, path in tables.items()}
    cases = []
    for i in range(count):
        name = rng.choice(sorted(tables))
        meta = [f for f in files[name] if not f.endswith(".parquet") or "_delta_log/" in f]
        data = [f for f in files[name] if f not in meta]
        cases.append(
            {
                "id": i,
                "dataset": name,
                "file": rng.choice(meta if rng.random() < 0.6 else data),
                "kind": rng.choice(DELTA_KINDS),
                "seed": rng.getrandbits(32),
                "target": targets[i % len(targets)],
            }
        )
    return cases


# --------------------------------------------------------------------------- reading


def _canon(value: Any, h: Any) -> None:
    import numpy as np

    if hasattr(value, "offsets") and hasattr(value, "values"):  # a jagged batch
        _canon(np.asarray(value.values), h)
        _canon(np.asarray(value.offsets), h)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (np.ndarray, list, tuple)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _canon(v, h)
    else:
        h.update(repr(value).encode())


def snapshot(path: str) -> str:
    """A digest of everything a reader gets: facts, then every batch in order."""
    from spark_dl_core import open_dataset

    ds = open_dataset(path)
    h = hashlib.sha256(repr((len(ds), ds.fingerprint, ds.columns)).encode())
    for batch in ds.iter_batches(batch_size=16, shuffle=True, seed=3):
        for name in sorted(batch):
            h.update(name.encode())
            _canon(batch[name], h)
    for batch in ds.iter_batches(batch_size=64, images="numpy"):
        for name in ("png", "jpeg"):
            if name in batch:
                _canon(batch[name], h)
    return h.hexdigest()


def _cli(command: str, path: str) -> str:
    import contextlib
    import io

    from spark_dl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([command, "--json", path] if command == "inspect" else [command, path])
    if code == 1:
        raise _CliFailed(err.getvalue())
    if code != 0:
        raise RuntimeError(f"spark-dl {command} exited {code}: {err.getvalue()}")
    text = out.getvalue().replace(path, "<path>")
    if command == "verify":  # "ok" must mean the data is the original's
        text += snapshot(path)
    return command + hashlib.sha256(text.encode()).hexdigest()


class _CliFailed(Exception):
    """The CLI reported a deliberate error (exit code 1, one line naming the problem)."""


_SPARK: list[Any] = []


def _spark_session() -> Any:
    if not _SPARK:
        from pyspark.sql import SparkSession

        import spark_dl

        session = (
            SparkSession.builder.master("local[1]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark_dl.register(session)
        _SPARK.append(session)
    return _SPARK[0]


def _spark_read(path: str) -> str:
    """``spark.read.format("mds")`` on a local session: every row (as a sorted multiset)."""
    try:
        rows = _spark_session().read.format("mds").load(path).collect()
    except Exception as exc:  # Spark wraps the data source's error: look for ours inside
        text = str(exc)
        if "spark_dl_core.errors." in text or "SparkDLError" in text:
            raise _CliFailed(text[-2000:]) from None
        raise
    return hashlib.sha256(repr(sorted(map(repr, rows))).encode()).hexdigest()


def run_target(target: str, path: str, version: int | None = None) -> str:
    if target in DELTA_TARGETS:  # pinned at the pristine table's version, as training is
        return delta_snapshot(path, target, version)
    if target == "read":
        return snapshot(path)
    if target == "spark-read":
        return _spark_read(path)
    if target == "selftest-abort":  # the harness's own tests: a crash and a hang are counted
        os.abort()
    if target == "selftest-hang":
        time.sleep(3600)
    return _cli(target.removeprefix("cli-"), path)


def run_case(case: dict[str, Any], pristine: dict[str, str], work: Path) -> dict[str, Any]:
    """Mutate a copy of the case's dataset and read it; the outcome and a detail."""
    from spark_dl_core import SparkDLError

    target = work / f"case-{case['id']}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine[case["dataset"]], target)
    has_compact = (target / METADATA[2]).exists()
    victim = target / case["file"]
    rng = random.Random(case["seed"])
    original = victim.read_bytes()
    if case["dataset"].startswith("delta-"):
        mutated = mutate_delta(original, case["kind"], rng, case["file"])
    else:
        mutated = mutate(original, case["kind"], rng)
    if mutated is None:
        victim.unlink()
    else:
        victim.write_bytes(mutated)
    expected_key = f"{case['dataset']}|{case['target']}"
    if expected_key not in _EXPECTED:  # the original must read (else the worker dies: seen)
        _EXPECTED[expected_key] = run_target(case["target"], pristine[case["dataset"]])
    try:
        got = run_target(case["target"], str(target), _pinned(pristine[case["dataset"]]))
    except (SparkDLError, _CliFailed) as exc:
        text = str(exc)
        named = Path(case["file"]).name in text
        return {"outcome": "typed" if named else "typed_unnamed", "detail": text[:300]}
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.format_exc(limit=-3)
        return {"outcome": "untyped", "detail": f"{type(exc).__name__}: {exc}"[:300], "tb": tb}
    finally:
        shutil.rmtree(target, ignore_errors=True)
    if got == _EXPECTED[expected_key]:
        return {"outcome": "same", "detail": ""}
    if _pages_only(case["file"], original, mutated):
        return {"outcome": "unchecked", "detail": "data pages changed in place"}
    why = _valid_log_change(case["file"], original, mutated)
    if why:
        return {"outcome": "unchecked", "detail": why}
    if case["kind"] == "remove" and case["file"] == META_FILE and not has_compact:
        # nothing records that the dataset had spark-dl metadata: it is now a valid dataset
        # as another MDS writer would write it, read without our column types
        return {"outcome": "no_metadata", "detail": ""}
    return {"outcome": "different", "detail": ""}


_EXPECTED: dict[str, str] = {}


def _pages_only(name: str, original: bytes, mutated: bytes | None) -> bool:
    """A Delta data file whose bytes changed in place (same size, both magics intact):
    Parquet as deltalake writes it has no checksum over pages or footer to catch it."""
    if not name.endswith(".parquet") or "_delta_log/" in name or mutated is None:
        return False
    ends = (mutated[:4], mutated[-4:]) == (original[:4], original[-4:])
    return len(mutated) == len(original) and len(original) >= 12 and ends


def _valid_log_change(name: str, original: bytes, mutated: bytes | None) -> str | None:
    """Why a Delta commit changed this way is still a valid log that no reader can tell
    from the one written (each changed action judged alone), or None:

    - an add lost its deletion vector (the key removed, renamed or null: readers ignore
      unknown keys, and an add without a vector is valid);
    - an inline vector's text changed to another sound vector (inline vectors have no
      CRC: it deletes other rows);
    - a whole action dropped or made an unknown action (``{}``, ``{"adc": ...}``: readers
      skip unknown actions, and a commit with one action less is valid), or the commit cut
      at a line boundary;
    - an add's partition value changed or lost its key (the value lives only in the log,
      and every reader takes a missing key as null);
    - the schema renamed a column (the files lack it: read as nulls, as a column added
      later is)."""
    if mutated is None or not name.endswith(".json") or "_delta_log/" not in name:
        return None
    before, after = _actions(original), _actions(mutated)
    if before is None or after is None:
        return None
    if len(after) < len(before) and after == before[: len(after)]:
        return "the commit lost its last actions (cut at a line boundary)"
    if len(before) != len(after):
        return None
    reasons = set()
    for a, b in zip(before, after):
        if a != b:
            why = _valid_action_change(a, b)
            if why is None:
                return None
            reasons.add(why)
    return "; ".join(sorted(reasons)) or None


_ACTIONS = {"add", "remove", "metaData", "protocol", "commitInfo", "txn", "cdc"}
_ACTIONS |= {"domainMetadata", "checkpointMetadata", "sidecar"}


def _actions(data: bytes) -> list[Any] | None:
    try:
        lines = data.decode().splitlines()
        return [json.loads(line, strict=False) for line in lines if line.strip()]
    except ValueError:
        return None


def _valid_action_change(a: Any, b: Any) -> str | None:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    if not set(b) & _ACTIONS:
        return "an action dropped or replaced by an unknown one (readers skip it)"
    add_a, add_b = a.get("add"), b.get("add")
    if isinstance(add_a, dict) and isinstance(add_b, dict) and "deletionVector" in add_a:
        rest_a = {k: v for k, v in add_a.items() if k != "deletionVector"}
        rest_b = {k: v for k, v in add_b.items() if k != "deletionVector"}
        dv_a, dv_b = add_a["deletionVector"], add_b.get("deletionVector")
        if dv_b is None and all(rest_b.get(k) == v for k, v in rest_a.items()):
            return "an add lost its deletion vector"
        if rest_a == rest_b and _sound_inline(dv_a, dv_b):
            return "an inline vector changed to another sound one"
    if isinstance(add_a, dict) and isinstance(add_b, dict):
        parts_a, parts_b = add_a.get("partitionValues"), add_b.get("partitionValues")
        others_a = {k: v for k, v in add_a.items() if k != "partitionValues"}
        if (
            isinstance(parts_a, dict)
            and isinstance(parts_b, dict)
            and others_a == {k: v for k, v in add_b.items() if k != "partitionValues"}
            and set(parts_b) <= set(parts_a)
        ):  # a partition value lives only in the log; a missing key reads as null
            return "an add's partition value changed or lost its key"
    meta_a, meta_b = a.get("metaData"), b.get("metaData")
    if isinstance(meta_a, dict) and isinstance(meta_b, dict):
        same = {k: v for k, v in meta_a.items() if k != "schemaString"}
        if same == {k: v for k, v in meta_b.items() if k != "schemaString"} and _renamed(
            meta_a.get("schemaString"), meta_b.get("schemaString")
        ):
            return "the schema renamed a column"
    return None


def _renamed(a: Any, b: Any) -> bool:
    """Schema strings ``a`` and ``b`` differ in their top-level field names only."""
    try:
        fa, fb = json.loads(a)["fields"], json.loads(b)["fields"]
    except (TypeError, ValueError, KeyError):
        return False
    strip = [{k: v for k, v in f.items() if k != "name"} for f in fa]
    return len(fa) == len(fb) and strip == [{k: v for k, v in f.items() if k != "name"} for f in fb]


def _sound_inline(a: Any, b: Any) -> bool:
    """``b`` is ``a`` with another inline text that the reader's checks accept."""
    from spark_dl_core.tables.delta.deletion_vectors import vector_problem

    if not isinstance(a, dict) or not isinstance(b, dict) or b.get("storageType") != "i":
        return False
    if {k: v for k, v in a.items() if k != "pathOrInlineDv"} != {
        k: v for k, v in b.items() if k != "pathOrInlineDv"
    }:
        return False
    return vector_problem(b, None) is None


def _pinned(path: str) -> int | None:
    """A pristine Delta table's latest version (its last commit file); None for MDS."""
    commits = sorted(Path(path).glob("_delta_log/*[0-9].json"))
    return int(commits[-1].name.split(".")[0]) if commits else None


def worker(cases_file: str, pristine_file: str) -> None:
    """Run cases in order, announcing each before it starts (so a death names it)."""
    import warnings

    warnings.simplefilter("ignore")
    cases = json.loads(Path(cases_file).read_text())
    pristine = json.loads(Path(pristine_file).read_text())
    if not any(c["target"] == "spark-read" for c in cases):  # a JVM reserves far more
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash ends at once, with no core file
    import spark_dl_core  # noqa: F401  (imported before the first case's clock starts)

    if any(c["target"].startswith("cli-") for c in cases):
        import spark_dl.cli  # noqa: F401
    if any(c["target"] == "spark-read" for c in cases):
        _spark_session()
    for key in sorted({(c["dataset"], c["target"]) for c in cases}):  # off the cases' clocks
        if not key[1].startswith("selftest-"):
            _EXPECTED["|".join(key)] = run_target(key[1], pristine[key[0]])
    # under the run's scratch directory (beside the cases file): removed with it even when
    # this process is killed
    with tempfile.TemporaryDirectory(prefix="work-", dir=Path(cases_file).parent) as work:
        for case in cases:
            print(f"S {case['id']}", flush=True)
            result = run_case(case, pristine, Path(work))
            print("R " + json.dumps({"id": case["id"], **result}), flush=True)


# --------------------------------------------------------------------------- driver


def _run_batch(
    cases: list[dict[str, Any]], pristine_file: str, scratch: Path, timeout: float
) -> list[dict[str, Any]]:
    """Run ``cases`` in as few workers as survive them; returns one result per case, with
    any case that killed or stalled its worker confirmed by running it alone."""
    results: dict[int, dict[str, Any]] = {}
    pending = list(cases)
    while pending:
        died, status = _run_worker(pending, pristine_file, scratch, timeout, results)
        pending = [c for c in pending if c["id"] not in results]
        if died is None:
            continue
        alone: dict[int, dict[str, Any]] = {}
        again, why = _run_worker([died], pristine_file, scratch, timeout, alone)
        if again is None:  # it passes alone: record what it did then, noting the first death
            results[died["id"]] = {**alone[died["id"]], "flaky": status}
        else:
            results[died["id"]] = {"id": died["id"], "outcome": why[0], "detail": why[1]}
        pending = [c for c in pending if c["id"] not in results]
    return [{**c, **results[c["id"]]} for c in cases]


def _run_worker(
    cases: list[dict[str, Any]],
    pristine_file: str,
    scratch: Path,
    timeout: float,
    results: dict[int, dict[str, Any]],
) -> tuple[dict[str, Any] | None, tuple[str, str]]:
    """One worker over ``cases``; fills ``results``. Returns the case it died or stalled
    in (None if it finished) and ("crash" | "hang", detail)."""
    fd, cases_file = tempfile.mkstemp(dir=scratch, suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(cases, f)
    by_id = {c["id"]: c for c in cases}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", cases_file, pristine_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    current: int | None = None
    deadline = time.monotonic() + max(120.0, timeout)  # start-up: imports, on a busy machine
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                proc.kill()
                proc.wait()
                stalled = by_id[current] if current is not None else cases[0]
                return stalled, ("hang", f"no answer within {timeout:.0f} s")
            line = proc.stdout.readline()
            if not line:
                code = proc.wait()
                if current is None and len(results) >= len(cases):
                    return None, ("", "")
                err = (proc.stderr.read() if proc.stderr else "")[-300:]
                died = by_id[current] if current is not None else cases[0]
                return died, ("crash", f"exit {code}: {err.strip()}")
            if line.startswith("S "):
                current = int(line[2:])
                deadline = time.monotonic() + timeout
            elif line.startswith("R "):
                result = json.loads(line[2:])
                results[result["id"]] = result
                current = None
                deadline = time.monotonic() + timeout
                if len(results) >= len(cases) and all(c["id"] in results for c in cases):
                    proc.wait()
                    return None, ("", "")
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.unlink(cases_file)


def run(
    count: int,
    seed: int = 0,
    jobs: int | None = None,
    batch: int = 250,
    timeout: float = 30.0,
    targets: list[str] | None = None,
    scratch: Path | None = None,
    delta: bool = False,
) -> tuple[Counter[str], list[dict[str, Any]]]:
    """Build the datasets (``delta``: the Delta tables), run ``count`` cases; the outcome
    counts and every bad case."""
    own = scratch is None
    root = Path(tempfile.mkdtemp(prefix="spark-dl-fuzz-")) if scratch is None else scratch
    try:
        pristine_file = root / ("pristine-delta.json" if delta else "pristine.json")
        if pristine_file.exists():  # built by an earlier run in this scratch directory
            datasets = {k: Path(v) for k, v in json.loads(pristine_file.read_text()).items()}
        else:
            build = build_delta_tables if delta else build_datasets
            datasets = build(root / ("pristine-delta" if delta else "pristine"))
            pristine_file.write_text(json.dumps({k: str(v) for k, v in datasets.items()}))
        if delta:
            cases = plan_delta_cases(datasets, count, seed, targets or list(DELTA_TARGETS))
        else:
            cases = plan_cases(datasets, count, seed, targets or ["read"])
        batches = [cases[i : i + batch] for i in range(0, len(cases), batch)]
        counts: Counter[str] = Counter()
        bad: list[dict[str, Any]] = []
        with ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
            for results in pool.map(
                lambda b: _run_batch(b, str(pristine_file), root, timeout), batches
            ):
                for r in results:
                    counts[r["outcome"]] += 1
                    if r["outcome"] in BAD or r.get("flaky"):
                        bad.append(r)
        return counts, bad
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--batch", type=int, default=250, help="cases per worker process")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument(
        "--targets",
        default="read",
        help="comma-separated: read, cli-inspect, cli-verify, spark-read (with --delta: "
        "delta-export, delta-inplace)",
    )
    parser.add_argument(
        "--delta", action="store_true", help="corrupt Delta tables (log, checkpoints, DVs, data)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    started = time.perf_counter()
    targets = args.targets.split(",")
    if args.delta and targets == ["read"]:
        targets = list(DELTA_TARGETS)
    counts, bad = run(
        args.cases, args.seed, args.jobs, args.batch, args.timeout, targets, delta=args.delta
    )
    took = time.perf_counter() - started
    if args.json:
        print(json.dumps({"counts": counts, "bad": bad, "seconds": took}, indent=1))
    else:
        total = sum(counts.values())
        print(f"{total:,} cases (seed {args.seed}) in {took:.0f} s")
        for outcome in OUTCOMES:
            print(f"  {outcome:<14} {counts.get(outcome, 0):>9,}")
        for r in bad[:50]:
            print(
                f"  {r['outcome']}: case {r['id']} {r['dataset']} {r['file']} {r['kind']} "
                f"{r['target']}: {r['detail']}"
                + (f" (its worker first ended: {r['flaky']}; not alone)" if r.get("flaky") else "")
            )
    sys.exit(1 if any(counts.get(o) for o in BAD) else 0)


if __name__ == "__main__":
    main()
