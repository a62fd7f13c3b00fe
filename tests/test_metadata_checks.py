"""Metadata is checked before it is parsed or used: each corrupted or forged value of
``spark_dl.json``, ``index.json`` or the compact index is a :class:`MetadataError` naming
the file and the field, and a corrupted file never serves another dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import MetadataError
from spark_dl_core.format.compact import _HEADER, COMPACT_FILE, COMPACT_MAGIC
from spark_dl_core.format.index import INDEX_FILE, META_FILE

ROWS = 300


@pytest.fixture
def path(tmp_path: Path) -> Path:
    table = pa.table(
        {
            "id": pa.array(np.arange(ROWS), pa.int64()),
            "s": pa.array([None if i % 7 == 0 else f"r{i}" for i in range(ROWS)]),
        }
    )
    out = tmp_path / "ds"
    write_mds(table, str(out), DatasetSpec(shard_size="1KiB", compression="zstd", nulls="mask"))
    return out


def _ids(path: Path) -> list[int]:
    return [int(i) for b in open_dataset(str(path)).iter_batches(batch_size=64) for i in b["id"]]


def _edit_meta(path: Path, where: tuple[Any, ...], value: Any, seal: bool = False) -> None:
    """Set one value of spark_dl.json; unsealed (no digest, as older files) unless ``seal``."""
    from spark_dl_core.meta import meta_bytes

    meta = json.loads((path / META_FILE).read_text())
    node = meta
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    del meta["digest"]
    (path / META_FILE).write_bytes(meta_bytes(meta) if seal else json.dumps(meta).encode())


def test_sealed_metadata_changed_by_one_byte_names_the_digest(path: Path) -> None:
    text = (path / META_FILE).read_text()
    at = text.index('"arrow_schema": "') + 30
    (path / META_FILE).write_text(text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1 :])
    with pytest.raises(MetadataError, match=r"spark_dl\.json field 'digest'") as info:
        open_dataset(str(path))
    assert info.value.file.endswith(META_FILE) and info.value.field == "digest"


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (("shards", 0, "samples"), "5", "shards.0.samples"),
        (("shards", 0, "samples"), -1, "shards.0.samples"),
        (("shards", 1), 7, "shards.1"),
        (("columns", "id", "encoding"), 3, "columns.id.encoding"),
        (("columns", "id"), None, "columns.id"),
        (("arrow_schema",), "!!not base64", "arrow_schema"),
        (("arrow_schema",), "QUJD", "arrow_schema"),  # base64 of bytes that are no schema
        (("num_samples",), 10**30, "num_samples"),
        (("num_samples",), ROWS + 1, "num_samples"),
        (("spec",), {"compression": 5}, "spec"),
        (("format_version",), 2, "format_version"),
        (("shards", 0, "shapes"), {"id": [-1]}, "shards.0.shapes.id.0"),
        # well-typed values that would change what is read: caught by the fingerprint
        (("columns", "id", "encoding"), "uint64", "fingerprint"),
        (("columns", "s", "null_mask"), None, "fingerprint"),
        (("spec", "nulls"), "error", "fingerprint"),
        (("shards", 0, "content_hash"), "0" * 32, "fingerprint"),
    ],
)
def test_each_bad_metadata_value_names_the_field(
    path: Path, where: tuple[Any, ...], value: Any, field: str
) -> None:
    _edit_meta(path, where, value)
    with pytest.raises(MetadataError) as info:
        _ids(path)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(str(path / META_FILE))


def test_resealed_metadata_of_other_shards_is_not_served(path: Path) -> None:
    """A well-formed, sealed spark_dl.json whose shard records differ from the index."""
    _edit_meta(path, ("shards", 0, "samples"), 1, seal=True)
    with pytest.raises(MetadataError, match=r"spark_dl\.json"):
        _ids(path)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("samples", True, "shards[1].samples"),
        ("samples", 2**64, "shards[1].samples"),
        ("column_names", [1, 2, 3], "shards[1].column_names"),
        ("column_sizes", [8, "8", None], "shards[1].column_names"),
        ("raw_data", {"basename": "shard.00001.mds", "bytes": 2**64}, "shards[1].raw_data.bytes"),
        ("raw_data", [], "shards[1].raw_data"),
        ("compression", 7, "shards[1].compression"),
        ("hashes", "xxh64", "shards[1].hashes"),
        ("size_limit", "big", "shards[1].size_limit"),
    ],
)
def test_each_bad_index_value_names_the_field(
    path: Path, field: str, value: Any, named: str
) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    index["shards"][1][field] = value
    (path / INDEX_FILE).write_text(json.dumps(index))
    (path / COMPACT_FILE).unlink()
    with pytest.raises(MetadataError) as info:
        open_dataset(str(path))
    assert info.value.field == named and info.value.file.endswith(INDEX_FILE)


def test_index_json_edited_with_valid_values_is_not_served(path: Path) -> None:
    """int64 read as uint64 would be other data: spark_dl.json's index digest refuses it."""
    index = json.loads((path / INDEX_FILE).read_text())
    for shard in index["shards"]:
        shard["column_encodings"][0] = "uint64"
    (path / INDEX_FILE).write_text(json.dumps(index, sort_keys=True))
    for compact in (True, False):
        if not compact:
            (path / COMPACT_FILE).unlink()
        with pytest.raises(MetadataError, match=r"spark_dl\.json") as info:
            _ids(path)
        assert info.value.field == "index_digest"


def test_forged_compact_index_with_a_valid_digest_is_refused_not_parsed_blindly(
    path: Path,
) -> None:
    """Even with a matching digest, the IPC bytes are validated in full before use (here
    index.json verifies against spark_dl.json, so it is read instead, with a warning)."""
    import xxhash

    expected = _ids(path)
    data = (path / COMPACT_FILE).read_bytes()
    ipc = bytearray(data[_HEADER.size :])
    for at in range(64, len(ipc) - 64, 97):  # scribble over buffers and the footer
        ipc[at] ^= 0x5A
    forged = _HEADER.pack(COMPACT_MAGIC, len(ipc), xxhash.xxh3_128_digest(bytes(ipc))) + ipc
    (path / COMPACT_FILE).write_bytes(forged)
    with pytest.warns(UserWarning, match=r"spark_dl\.index\.arrow: not a spark-dl compact"):
        assert _ids(path) == expected


def test_removed_metadata_is_noticed_where_the_compact_index_records_it(path: Path) -> None:
    (path / META_FILE).unlink()
    with pytest.raises(MetadataError, match=r"spark_dl\.json: is missing") as info:
        open_dataset(str(path))
    assert info.value.file.endswith(META_FILE)


def test_truncated_compact_index_falls_back_to_the_verified_index(path: Path) -> None:
    expected = _ids(path)
    data = (path / COMPACT_FILE).read_bytes()
    (path / COMPACT_FILE).write_bytes(data[: len(data) // 3])
    with pytest.warns(UserWarning, match=r"spark_dl\.index\.arrow.*matches spark_dl\.json"):
        assert _ids(path) == expected
