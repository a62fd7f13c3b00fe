"""Planning a local snapshot reads each data file's footer with ``os.pread``
(tables/parquet/footer.read_local_footer), not a pyarrow filesystem and file object: the same bytes
as :func:`read_footer`, and for a file that is missing, a directory, too short, or whose head
or tail is not Parquet's, the same error word for word. Real Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import LocalFileSystem

from spark_dl_core.tables.parquet.footer import read_footer, read_local_footer


def _outcome(read: Any, path: str) -> tuple[str, Any]:
    try:
        return "bytes", read(path)
    except Exception as exc:  # the exact type and words are the point
        return type(exc).__name__, str(exc)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    table = pa.table(
        {"id": pa.array(range(300), pa.int64()), "s": [str(i) * 3 for i in range(300)]}
    )
    good = tmp_path / "good.parquet"
    pq.write_table(table, good, row_group_size=10)  # a footer of 30 row groups: several kB
    data = good.read_bytes()
    out = {"good": good, "dir": tmp_path / "dir", "missing": tmp_path / "gone.parquet"}
    out["dir"].mkdir()
    damaged = {
        "half": data[: len(data) // 2],
        "tiny": data[:11],
        "empty": b"",
        "head": b"XXXX" + data[4:],
        "tail": data[:-4] + b"PAR0",
        "length": data[:-8] + (len(data)).to_bytes(4, "little") + b"PAR1",
    }
    for name, content in damaged.items():
        out[name] = tmp_path / f"{name}.parquet"
        out[name].write_bytes(content)
    return out


@pytest.mark.parametrize("guess", [64 << 10, 64])  # one read of the tail, or two
def test_local_footer_reads_as_pyarrow_does(files: dict[str, Path], guess: int) -> None:
    for name, path in files.items():
        fast = _outcome(lambda p: read_local_footer(p, guess), str(path))
        slow = _outcome(lambda p: read_footer(LocalFileSystem(), p, guess), str(path))
        assert fast == slow, name
    assert _outcome(read_local_footer, str(files["good"]))[0] == "bytes"
