"""The public API refuses mistakes at the call or at build time, never at the first batch."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import spark_dl_core
from spark_dl_core import SpecError, open_dataset, write_mds
from spark_dl_core.errors import ColumnNotFoundError
from spark_dl_core.sources.dataset import Dataset


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
    from spark_dl_core.tables.delta.snapshot import DeltaSnapshot
    from spark_dl_core.tables.delta.table import open_delta as core_open_delta

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


def test_one_default_batch_size_and_no_silent_disagreement(tmp_path: Path) -> None:
    """Every loading call takes LoaderSettings' default batch size; a batch size given beside
    settings= that disagrees with them is refused, naming both, instead of one being lost."""
    from spark_dl_core import LoaderSettings

    path = tmp_path / "big"
    write_mds(pa.table({"id": np.arange(600, dtype=np.int64)}), str(path))
    ds = open_dataset(str(path))
    default = LoaderSettings().batch_size
    assert len(next(iter(ds.iter_batches()))["id"]) == default
    assert len(ds.sample_order()[0]) == default
    assert len(next(iter(ds.to_torch()))["id"]) == default
    given = LoaderSettings(batch_size=100)
    assert len(next(iter(ds.iter_batches(settings=given)))["id"]) == 100
    assert len(next(iter(ds.iter_batches(100, settings=given)))["id"]) == 100
    for call in (ds.iter_batches, ds.sample_order, ds.to_torch, ds.to_tf):
        with pytest.raises(SpecError, match=r"batch_size=512.*batch_size=100"):
            call(512, settings=given)


# ---------------------------------------------------------------- settings checked at build

_BAD_READS = [
    ({"columns": ["nope"]}, ColumnNotFoundError, ["columns", "nope"]),
    ({"columns": ["id", "id"]}, SpecError, ["columns", "'id'"]),
    (
        {"transforms": [{"op": "drop", "columns": ["nope"], "at": "read"}]},
        SpecError,
        ["drop", "'columns'", "nope"],
    ),
    (
        {"transforms": [{"op": "select", "columns": ["x", "nope"]}]},
        SpecError,
        ["select", "'columns'", "nope"],
    ),
    (
        {"transforms": [{"op": "select", "columns": ["x", "x"]}]},
        SpecError,
        ["select", "'columns'", "'x'"],
    ),
    (
        {"transforms": [{"op": "rename", "mapping": {"x": "id"}}]},
        SpecError,
        ["rename", "'mapping'", "'id'"],
    ),
    (
        {"transforms": [{"op": "rename", "mapping": {"nope": "y"}}]},
        SpecError,
        ["rename", "'mapping'", "nope"],
    ),
    (
        {
            "transforms": [
                {"op": "drop", "columns": ["x"]},
                {"op": "cast", "column": "x", "to": "int32"},
            ]
        },
        SpecError,
        ["cast", "'column'", "'x'"],
    ),
]


@pytest.mark.parametrize("framework", ["numpy", "torch", "tf"])
@pytest.mark.parametrize(("settings", "error", "named"), _BAD_READS)
def test_read_settings_are_checked_when_the_loader_is_built(
    tmp_path: Path, framework: str, settings: dict[str, Any], error: type, named: list[str]
) -> None:
    ds = open_dataset(_small(tmp_path))
    build = {"numpy": ds.iter_batches, "torch": ds.to_torch, "tf": ds.to_tf}[framework]
    with pytest.raises(error) as caught:
        build(4, **settings)  # no batch asked for: the loader itself refuses
    assert all(part in str(caught.value) for part in named), str(caught.value)


def test_read_ops_follow_the_columns_of_earlier_ops(tmp_path: Path) -> None:
    ds = open_dataset(_small(tmp_path))
    swap = [{"op": "rename", "mapping": {"x": "id", "id": "x"}}]
    (batch,) = list(ds.iter_batches(8, transforms=swap))
    assert batch["x"].tolist() == list(range(8)) and batch["id"].dtype.kind == "f"
    renamed = [
        {"op": "rename", "mapping": {"x": "y"}},
        {"op": "normalize", "column": "y", "mean": 1.0},
    ]
    (batch,) = list(ds.iter_batches(8, transforms=renamed))
    assert batch["y"].tolist()[:2] == [-1.0, 0.0]


def test_a_recorded_read_rename_onto_a_column_is_refused_at_write(tmp_path: Path) -> None:
    spec = {"transforms": [{"op": "rename", "mapping": {"x": "id"}, "at": "read"}]}
    table = pa.table({"id": [1, 2], "x": [0.5, 1.5]})
    with pytest.raises(SpecError, match=r"rename.*'mapping'.*'id'"):
        write_mds(table, str(tmp_path / "d"), spec)


def test_write_mds_refuses_duplicate_column_names(tmp_path: Path) -> None:
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2.0])], names=["a", "a"])
    with pytest.raises(SpecError, match="column 'a' 2 times"):
        write_mds(table, str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()
    write_mds(pa.table({"a": [1]}), str(tmp_path / "e"))
    with pytest.raises(SpecError, match="column 'a' 2 times"):
        write_mds(table, str(tmp_path / "e"), mode="append")


# ---------------------------------------------------------------- non-finite floats in json

_SPECIAL = [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 0.1]
_F32 = [pa.scalar(v, pa.float32()).as_py() for v in _SPECIAL]


def _special_table() -> pa.Table:
    n = len(_SPECIAL)
    return pa.table(
        {
            "s": pa.array(
                [{"a": v, "b": w, "c": [v, w]} for v, w in zip(_SPECIAL, _F32)],
                pa.struct(
                    [("a", pa.float64()), ("b", pa.float32()), ("c", pa.list_(pa.float64()))]
                ),
            ),
            "m": pa.array(
                [[("k", v), ("j", -v)] for v in _SPECIAL], pa.map_(pa.string(), pa.float64())
            ),
            "ragged": pa.array([[[v], [v, v]] for v in _SPECIAL], pa.list_(pa.list_(pa.float64()))),
            "j": pa.array([[v, 1.0] for v in _SPECIAL], pa.list_(pa.float64())),
            "id": list(range(n)),
        }
    )


def _same(a: Any, b: Any) -> bool:
    """Equal with NaN equal to NaN and -0.0 told from 0.0 (repr shows both)."""
    return repr(a) == repr(b)


def test_non_finite_floats_in_json_columns_round_trip_exactly(tmp_path: Path) -> None:
    table = _special_table()
    path = str(tmp_path / "d")
    write_mds(table, path, {"columns": {"j": "json", "ragged": "json"}})
    ds = open_dataset(path)
    assert {c: ds.columns[c] for c in ("s", "m", "ragged", "j")} == dict.fromkeys(
        ("s", "m", "ragged", "j"), "json"
    )
    back = ds.to_arrow()
    assert back.schema == table.schema
    for name in table.column_names:
        assert _same(back.column(name).to_pylist(), table.column(name).to_pylist()), name
    (batch,) = list(ds.iter_batches(len(_SPECIAL)))
    assert _same([v["a"] for v in batch["s"]], _SPECIAL)
    assert _same([v["b"] for v in batch["s"]], _F32)
    assert _same(list(batch["j"]), [[v, 1.0] for v in _SPECIAL])
    (torch_batch,) = list(ds.to_torch(len(_SPECIAL), columns=["s", "id"]))
    assert _same([v["a"] for v in torch_batch["s"]], _SPECIAL)


def test_non_finite_floats_in_spark_structs_and_maps_round_trip(
    classic_spark: Any, tmp_path: Path
) -> None:
    spark = classic_spark
    import spark_dl  # noqa: F401  (registers the mds source)

    rows = [({"a": v, "b": [v]}, {"k": v}, i) for i, v in enumerate(_SPECIAL)]
    df = spark.createDataFrame(
        rows, "s struct<a: double, b: array<double>>, m map<string, double>, id long"
    )
    path = str(tmp_path / "spark")
    df.write.format("mds").save(path)
    back = spark.read.format("mds").load(path).orderBy("id").collect()
    assert _same([r["s"]["a"] for r in back], _SPECIAL)
    assert _same([r["s"]["b"] for r in back], [[v] for v in _SPECIAL])
    assert _same([r["m"]["k"] for r in back], _SPECIAL)
    (core,) = list(open_dataset(path).iter_batches(len(_SPECIAL), columns=["s"]))
    assert sorted(map(repr, (v["a"] for v in core["s"]))) == sorted(map(repr, _SPECIAL))


# ---------------------------------------------------------------- CLI arguments and messages


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["inspect", "somewhere", "--samples", "-3"], "--samples"),
        (["inspect", "somewhere", "--samples", "three"], "--samples"),
        (["export", "t", "--out", "o", "--version", "-1"], "--version"),
        (["sql", "f.sql", "--limit", "-5"], "--limit"),
    ],
)
def test_cli_numeric_arguments_are_checked(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_dl.cli import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_cli_export_of_a_missing_table_says_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_dl.cli import main

    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "Os {" not in err, err


def test_cli_delta_export_of_a_parquet_directory_suggests_the_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    from spark_dl.cli import main

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "pq" / "part-0.parquet")
    out = str(tmp_path / "o")
    assert main(["export", str(tmp_path / "pq"), "--out", out, "--no-progress"]) == 1
    assert "--format parquet" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "pq"), "--out", out, "--format", "parquet"]) == 0
    assert len(open_dataset(out)) == 2


# ---------------------------------------------------------------- exact (torchvision) images


def _sharp_jpeg(w: int, h: int, seed: int) -> bytes:
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 2, size=(h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8) * 255
    pixels = np.repeat(np.repeat(cells, 4, axis=0), 4, axis=1)[:h, :w]  # hard edges
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="JPEG", quality=95)
    return out.getvalue()


def _torchvision_reference(raw: bytes, resize: int | None, crop: int) -> np.ndarray:
    """torchvision v2 ``Resize(resize)`` then ``CenterCrop(crop)`` on a uint8 tensor of the
    full-resolution image, spelled out: shorter side to ``resize`` (longer one truncated),
    antialiased bilinear in uint8 (float32 rounded back where torch has no uint8 kernel),
    then the whole-pixel central crop (rounded offsets, zero padding when larger)."""
    import io

    import torch
    import torch.nn.functional as functional
    from PIL import Image

    image = torch.from_numpy(np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")).copy())
    image = image.permute(2, 0, 1).contiguous()
    h, w = image.shape[1:]
    if resize is not None:
        size = (int(resize * h / w), resize) if w <= h else (resize, int(resize * w / h))
        native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
        batch = image[None] if native else image[None].float()
        batch = functional.interpolate(
            batch, size=size, mode="bilinear", antialias=True, align_corners=False
        )
        image = batch[0] if native else batch[0].round().to(torch.uint8)
    h, w = image.shape[1:]
    if crop > h or crop > w:
        dh, dw = max(crop - h, 0), max(crop - w, 0)
        image = functional.pad(image, (dw // 2, (dw + 1) // 2, dh // 2, (dh + 1) // 2))
        h, w = image.shape[1:]
    top, left = round((h - crop) / 2.0), round((w - crop) / 2.0)
    return image[:, top : top + crop, left : left + crop].permute(1, 2, 0).numpy()


def test_exact_image_ops_equal_torchvision_at_full_resolution(tmp_path: Path) -> None:
    sizes = [(500, 375), (375, 500), (333, 251), (97, 130)]
    raws = [_sharp_jpeg(w, h, i) for i, (w, h) in enumerate(sizes)]
    path = str(tmp_path / "img")
    write_mds(pa.table({"image": pa.array(raws, pa.binary()), "id": range(len(raws))}), path)
    ds = open_dataset(path)
    exact = {"op": "image_decode", "column": "image", "exact": True}
    ops: list[dict[str, Any]] = [
        {"op": "resize", "column": "image", "size": 256},
        {"op": "center_crop", "column": "image", "size": 224},
    ]
    (got,) = list(ds.iter_batches(len(raws), transforms=[exact, *ops]))
    want = np.stack([_torchvision_reference(r, 256, 224) for r in raws])
    assert got["image"].shape == want.shape == (len(raws), 224, 224, 3)
    np.testing.assert_array_equal(got["image"], want)
    (torch_batch,) = list(ds.to_torch(len(raws), transforms=[exact, *ops]))
    np.testing.assert_array_equal(torch_batch["image"].numpy(), want)
    # the default (reduced-scale decode, one fused resample) differs at sharp edges
    default = {"op": "image_decode", "column": "image"}
    (fast,) = list(ds.iter_batches(len(raws), transforms=[default, *ops]))
    assert not np.array_equal(fast["image"][:3], want[:3])
    # a shorter-side resize keeps torchvision's sizes (longer side truncated, not rounded)
    shorter = [exact, {"op": "resize", "column": "image", "size": 96}]
    (sized,) = list(ds.iter_batches(len(raws), transforms=shorter))
    shapes = [tuple(image.shape[:2]) for image in sized["image"]]
    assert shapes == [(96, 128), (128, 96), (96, 127), (128, 96)]
    # a center crop larger than the image pads it with zeros, as torchvision does
    crop = [exact, {"op": "center_crop", "column": "image", "size": 120}]
    (padded,) = list(ds.iter_batches(len(raws), transforms=crop))
    np.testing.assert_array_equal(padded["image"][3], _torchvision_reference(raws[3], None, 120))
    assert padded["image"][3][0, 0].tolist() == [0, 0, 0]


def test_exact_random_ops_are_reproducible_and_recorded_only_when_on(tmp_path: Path) -> None:
    from spark_dl_core.ops.transforms import ImageDecode

    assert "exact" not in ImageDecode(column="image").model_dump()  # fingerprints unchanged
    assert ImageDecode(column="image", exact=True).model_dump()["exact"] is True
    raws = [_sharp_jpeg(120, 90, i) for i in range(6)]
    path = str(tmp_path / "img")
    write_mds(pa.table({"image": pa.array(raws, pa.binary())}), path)
    ds = open_dataset(path)
    ops = [
        {"op": "image_decode", "column": "image", "exact": True},
        {"op": "random_resized_crop", "column": "image", "size": 32},
        {"op": "horizontal_flip", "column": "image"},
    ]
    first = [b["image"] for b in ds.iter_batches(3, transforms=ops, seed=4)]
    again = [b["image"] for b in ds.iter_batches(3, transforms=ops, seed=4)]
    assert all(a.shape == (3, 32, 32, 3) for a in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_a_missing_optional_library_names_the_extra_that_installs_it() -> None:
    """One table (errors.EXTRAS) says which extra installs each optional library."""
    from spark_dl_core.errors import MissingDependencyError, optional_import

    with pytest.raises(MissingDependencyError, match=r"video ops needs 'av': .*\[media\]"):
        optional_import("av.no_such_module", "video ops")
    with pytest.raises(MissingDependencyError, match=r"pip install no_such_lib"):
        optional_import("no_such_lib", "something")
    assert optional_import("numpy", "anything").__name__ == "numpy"
