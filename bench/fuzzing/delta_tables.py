"""The Delta target family: small tables written by deltalake with deletion vectors as
delta-spark commits them (on-disk files and inline, Z85-encoded), one of them
checkpointed; the kinds of corruption that a Delta log, a deletion vector and a Parquet
footer add to the plain ones, and the cases planned over a table's files."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from bench.fuzzing.mutations import KINDS, OTHER_VALUES, get_at, json_nodes, mutate, set_at
from tests.delta_helpers import roaring64

DELTA_KINDS = (*KINDS, "footer", "json_dv", "json_line")
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"


def inline_dv(rows: list[int]) -> dict[str, Any]:
    """An inline deletion vector (``storageType`` ``i``): the bitmap Z85-encoded in the log."""
    import base64

    blob = roaring64(rows)
    padded = blob + b"\0" * (-len(blob) % 4)
    text = base64.b85encode(padded).decode().translate(str.maketrans(B85, Z85))
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
    encoded = base64.b85encode(name.bytes).decode().translate(str.maketrans(B85, Z85))
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
        nodes = [n for n in json_nodes(obj)[1:] if kind == "json_line" or "deletionVector" in n]
        target = rng.choice(nodes or [()])
        if rng.random() < 0.3 and target:
            obj = set_at(obj, target, None, delete=True)
        else:
            value = get_at(obj, target) if target else None
            if isinstance(value, str) and value and rng.random() < 0.5:
                chars = list(value)
                chars[rng.randrange(len(chars))] = rng.choice(Z85)
                new: Any = "".join(chars)
            elif isinstance(value, int) and not isinstance(value, bool):
                new = value + rng.choice([-1, 1, 8, -(2**31), 2**40])
            else:
                new = rng.choice(OTHER_VALUES)
            obj = set_at(obj, target, new)
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
