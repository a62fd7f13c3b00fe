"""The public API refuses mistakes at the call or at build time, never at the first batch."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import spark_dl_core
from spark_dl_core import open_dataset, write_mds
from spark_dl_core.dataset import Dataset


def _small(tmp_path: Path, name: str = "d") -> str:
    path = str(tmp_path / name)
    write_mds(pa.table({"id": list(range(8)), "x": [float(i) for i in range(8)]}), path)
    return path


def _positional(fn: Any) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


def test_second_path_to_open_dataset_is_a_type_error(tmp_path: Path) -> None:
    web, code = _small(tmp_path, "web"), _small(tmp_path, "code")
    with pytest.raises(TypeError):
        open_dataset(web, code)  # type: ignore[misc]
    assert not (Path(code) / "shards").exists()  # nothing was used as a cache directory


def test_openers_and_loader_factories_take_one_positional_argument() -> None:
    import spark_dl
    from spark_dl.accessor import DLAccessor
    from spark_dl_core.delta import DeltaSnapshot
    from spark_dl_core.delta import open_delta as core_open_delta

    expected = {
        spark_dl_core.open_dataset: ["path"],
        spark_dl_core.open_delta: ["path"],
        core_open_delta: ["path"],
        spark_dl_core.write_compact_index: ["path"],
        spark_dl_core.write_mds: ["data", "path", "spec"],
        Dataset.iter_batches: ["self", "batch_size"],
        Dataset.sample_order: ["self", "batch_size"],
        Dataset.to_torch: ["self", "batch_size"],
        Dataset.to_tf: ["self", "batch_size"],
        Dataset.to_arrow: ["self", "columns"],
        DeltaSnapshot.write_mds: ["self", "out_path", "spec"],
        DLAccessor.write_mds: ["self", "path", "spec"],
        DLAccessor.to_torch: ["self", "batch_size"],
        DLAccessor.to_tf: ["self", "batch_size"],
        DLAccessor.converter: ["self", "spec"],
        spark_dl.read_delta: ["spark", "path"],
    }
    got = {f: _positional(f) for f in expected}
    wrong = {f.__qualname__: got[f] for f, want in expected.items() if got[f] != want}
    assert not wrong, wrong


def test_loader_settings_after_batch_size_are_keywords(tmp_path: Path) -> None:
    ds = open_dataset(_small(tmp_path))
    with pytest.raises(TypeError):
        ds.iter_batches(4, True)  # type: ignore[misc]
    assert [len(b["id"]) for b in ds.iter_batches(4, shuffle=True)] == [4, 4]
