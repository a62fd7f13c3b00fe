"""Hostile datasets: mutated shards and index files end in a clear error naming the file.

Never a crash, a hang, a foreign exception type or an allocation sized by a forged field.
"""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_dl_core import DatasetError, DatasetSpec, HashMismatchError, open_dataset, write_mds

ROWS = 60


def _table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(np.arange(ROWS), pa.int64()),
            "text": [f"row {i} " * (i % 5) for i in range(ROWS)],
            "ragged": pa.array([list(range(i % 7)) for i in range(ROWS)], pa.list_(pa.int16())),
            "any": pa.array([np.arange(i % 3 + 1, dtype=np.float32) for i in range(ROWS)]),
            "meta": [{"k": i} for i in range(ROWS)],
        }
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    paths = {}
    for name, spec in {
        "raw": DatasetSpec(shard_size="2KiB", columns={"any": "ndarray"}),
        "zstd": DatasetSpec(shard_size="2KiB", compression="zstd", columns={"any": "ndarray"}),
    }.items():
        write_mds(_table(), str(root / name), spec)
        paths[name] = root / name
    return paths


def _read_all(path: Path, verify_hashes: bool | None = False) -> int:
    """Hash checks off by default: these cases test that the decoder itself stays safe."""
    ds = open_dataset(path)
    return sum(len(b["id"]) for b in ds.iter_batches(batch_size=16, verify_hashes=verify_hashes))


def _expect_clean_outcome(path: Path, shard: str) -> None:
    """Reading either works or raises a DatasetError naming the file; nothing else."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        _read_all(path)
    except DatasetError as exc:
        assert shard in str(exc) or "index.json" in str(exc), str(exc)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256, f"reading a mutated shard grew memory by {grown_mib:.0f} MiB"


mutation = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4000), st.integers(min_value=0, max_value=255)),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flips=mutation, cut=st.one_of(st.none(), st.integers(min_value=0, max_value=3000)))
@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_mutated_shards_fail_cleanly(
    pristine: dict[str, Path],
    tmp_path: Path,
    kind: str,
    flips: list[tuple[int, int]],
    cut: int | None,
) -> None:
    target = tmp_path / kind
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine[kind], target)
    index = json.loads((target / "index.json").read_text())
    shard = index["shards"][1]["zip_data" if kind == "zstd" else "raw_data"]["basename"]
    data = bytearray((target / shard).read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    (target / shard).write_bytes(bytes(data))
    _expect_clean_outcome(target, shard)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("samples", 2**31),
        ("samples", -1),
        ("column_sizes", [8, 8, 8, 8, 8]),
        ("column_encodings", ["int64", "str", "ndarray:int16", "ndarray", "pkl2"]),
        ("zip_data", {"basename": "shard.00001.mds.zstd", "bytes": 10, "hashes": {}}),
        ("raw_data", {"basename": "shard.00001.mds", "bytes": 2**40, "hashes": {}}),
        ("format", "json"),
    ],
)
def test_forged_index_fields_fail_cleanly(
    pristine: dict[str, Path], tmp_path: Path, field: str, value: object
) -> None:
    target = tmp_path / "ds"
    shutil.copytree(pristine["raw"], target)
    index = json.loads((target / "index.json").read_text())
    index["shards"][1][field] = value
    (target / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError):
        _read_all(target)


def test_decompression_bomb_is_bounded(pristine: dict[str, Path], tmp_path: Path) -> None:
    import zstandard

    target = tmp_path / "ds"
    shutil.copytree(pristine["zstd"], target)
    index = json.loads((target / "index.json").read_text())
    shard = index["shards"][0]["zip_data"]["basename"]
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (512 << 20))
    (target / shard).write_bytes(bomb)
    index["shards"][0]["zip_data"]["bytes"] = len(bomb)
    (target / "index.json").write_text(json.dumps(index))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DatasetError, match=shard):
        _read_all(target)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 128


def test_bad_utf8_names_the_file(pristine: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "ds"
    shutil.copytree(pristine["raw"], target)
    index = json.loads((target / "index.json").read_text())
    shard = index["shards"][0]["raw_data"]["basename"]
    data = bytearray((target / shard).read_bytes())
    at = data.find(b"row 1 ")
    data[at : at + 2] = b"\xff\xfe"
    (target / shard).write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"{shard}.*'text'.*UTF-8"):
        _read_all(target)
    # by default the shard's recorded hash catches the change before anything is decoded
    with pytest.raises(HashMismatchError, match=rf"{shard}.*spark_dl.json"):
        _read_all(target, verify_hashes=None)


def test_symlink_out_of_the_dataset_is_refused(pristine: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "ds"
    shutil.copytree(pristine["raw"], target)
    index = json.loads((target / "index.json").read_text())
    shard = index["shards"][0]["raw_data"]["basename"]
    outside = tmp_path / "outside.mds"
    (target / shard).rename(outside)
    (target / shard).symlink_to(outside)
    with pytest.raises(DatasetError, match="outside the dataset"):
        _read_all(target)
