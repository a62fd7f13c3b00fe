"""An unknown transform op is refused with the known ops and the closest one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import SpecError, SpecValidationError
from spark_dl_core.ops.transforms import known_ops, parse_transforms


def test_known_ops_lists_every_op() -> None:
    ops = known_ops()
    assert {"select", "resize", "random_resized_crop", "to_chw"} <= set(ops)
    assert len(ops) == len(set(ops))


def test_misspelt_op_names_the_closest_and_the_known_ones() -> None:
    with pytest.raises(SpecError) as caught:
        parse_transforms([{"op": "resise", "column": "image", "size": 8}])
    text = str(caught.value)
    assert "unknown transform op 'resise' (did you mean 'resize'?)" in text
    assert "the ops are: " + ", ".join(known_ops()) in text
    assert "tagged-union" not in text and "pydantic" not in text and "type=" not in text


def test_unknown_op_in_a_dataset_spec_names_the_field() -> None:
    with pytest.raises(SpecValidationError) as caught:
        DatasetSpec(transforms=[{"op": "select", "columns": ["a"]}, {"op": "dorp"}])
    assert caught.value.fields == ["transforms.1"]
    assert "unknown transform op 'dorp' (did you mean 'drop'?)" in str(caught.value)
    assert "tagged-union" not in str(caught.value)


def test_missing_op_and_bad_fields_are_short(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"a transform names its op .*the ops are: select"):
        parse_transforms([{"column": "x"}])
    with pytest.raises(SpecError, match=r"unknown transform op 'zzz'; the ops are"):
        parse_transforms({"op": "zzz"})
    with pytest.raises(SpecError, match=r"resize\.column: Field required") as caught:
        parse_transforms([{"op": "resize", "size": 8}])
    assert "errors.pydantic.dev" not in str(caught.value)
    # the loaders refuse it the same way, before any batch
    path = str(tmp_path / "ds")
    write_mds(pa.table({"x": np.arange(4)}), path)
    with pytest.raises(SpecError, match=r"did you mean 'normalize'"):
        next(iter(open_dataset(path).iter_batches(2, transforms=[{"op": "normalise"}])))


def test_specs_with_transforms_keep_their_json_and_fingerprints(tmp_path: Path) -> None:
    """Values computed before the ops moved behind a registry: the spec JSON of every kind
    of op, and a written dataset's fingerprint, must not change with how ops are found."""
    import hashlib
    import json

    table = pa.table(
        {
            "id": pa.array(np.arange(50), pa.int64()),
            "x": pa.array(np.arange(50) / 7, pa.float64()),
            "name": [f"n{i}" for i in range(50)],
            "clip": [bytes([i]) * 5 for i in range(50)],
        }
    )
    read_ops: list[dict[str, object]] = [
        {"op": "image_decode", "column": "clip", "at": "read"},
        {"op": "resize", "column": "clip", "size": [8, 8]},
        {"op": "center_crop", "column": "clip", "size": 4, "fill": 3},
        {"op": "random_resized_crop", "column": "clip", "size": 4},
        {"op": "horizontal_flip", "column": "clip", "p": 0.25},
        {"op": "normalize", "column": "clip", "mean": [0.5, 0.4, 0.3], "std": [0.2] * 3},
        {"op": "to_chw", "column": "clip"},
        {"op": "audio_decode", "column": "clip", "sample_rate": 8000, "mono": True},
        {"op": "audio_crop", "column": "clip", "seconds": 0.5, "start": "center"},
        {"op": "video_decode", "column": "clip", "num_frames": 4, "stride": 2, "start": "begin"},
    ]
    read_ops[5]["at"] = "read"
    spec = DatasetSpec(
        shard_size="1KiB",
        transforms=[
            {"op": "rename", "mapping": {"name": "label"}},
            {"op": "cast", "column": "x", "to": "float32"},
            {"op": "normalize", "column": "x", "mean": 1.0, "std": 2.0},
            *read_ops,
            {"op": "select", "columns": ["id", "x", "label", "clip"]},
        ],
    )
    written = write_mds(table, str(tmp_path / "ds"), spec)
    assert written.fingerprint == "b02db64243dd0e96f27070fb5e8631d166867b863be094df96b99b987d03fbb2"
    write_ops = DatasetSpec(
        transforms=[
            {"op": "reencode_image", "column": "img", "max_side": 64},
            {"op": "tokenize", "column": "text", "tokenizer": "tok.json", "eos_token": "</s>"},
            {"op": "python", "function": "m:f", "output_schema": {"a": "int64"}},
            {"op": "drop", "columns": ["a"]},
            {"op": "image_decode", "column": "img", "mode": "L", "exact": True},
            {"op": "reencode_audio", "column": "audio", "sample_rate": 16000, "format": "ogg"},
        ]
    )
    canonical = json.dumps(write_ops.canonical(), sort_keys=True).encode()
    digest = "b1fb4d1934d43fa98ac06a4b7f914b72c7151481f541f95abc4037c1062079c9"
    assert hashlib.sha256(canonical).hexdigest() == digest, canonical


# --------------------------------------------------------------------------- the op registry


def test_ops_import_one_way_media_rooms_register_themselves() -> None:
    """The op vocabulary imports no media module (tests/test_layout.py holds every import's
    direction); the media modules are imported when an op needs them, and register."""
    # the media rooms are imported when an op needs them, not with the spec vocabulary
    script = (
        "import sys\n"
        "from spark_dl_core.ops.transforms import parse_transforms\n"
        "ops = parse_transforms([{'op': 'video_decode', 'column': 'v'},\n"
        "                        {'op': 'reencode_audio', 'column': 'a'}])\n"
        "media = {'spark_dl_core.media.clips', 'spark_dl_core.media.audio_codec'}\n"
        "assert not media & set(sys.modules)\n"
        "from spark_dl_core.ops.registry import implementation\n"
        "implementation('video_decode')\n"
        "assert 'spark_dl_core.media.clips' in sys.modules\n"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", script], check=True)


def test_ops_declare_what_they_read_and_what_batches_leave_as(tmp_path: Path) -> None:
    from spark_dl_core.ops.transforms import decoders_of, op_models, ops_for

    starts = {m.model_fields["op"].default: m.facts.starts for m in op_models()}
    assert {k: v for k, v in starts.items() if v} == {
        "image_decode": "image",
        "audio_decode": "audio",
        "video_decode": "video",
    }
    assert ops_for("audio") == ["audio_crop"]
    assert set(ops_for("video")) == set(ops_for("image"))  # the image ops apply per frame
    assert decoders_of(("image", "video")) == ["image_decode", "video_decode"]
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    pictures = []
    for i in range(4):
        out = io.BytesIO()
        Image.new("RGB", (20 + i, 16), (10 * i, 50, 90)).save(out, format="PNG")
        pictures.append(out.getvalue())
    write_mds(pa.table({"image": pictures}), str(tmp_path / "images"))
    ds = open_dataset(tmp_path / "images")
    ops = parse_transforms(
        [
            {"op": "image_decode", "column": "image"},
            {"op": "resize", "column": "image", "size": [8, 8]},
            {"op": "normalize", "column": "image", "mean": 0.5, "std": 0.25},
        ]
    )
    for upto in (2, 3):
        batch = next(iter(ds.iter_batches(batch_size=4, transforms=ops[:upto])))
        declared = [op.facts.dtype for op in ops[:upto] if op.facts.dtype][-1]
        assert batch["image"].dtype == np.dtype(declared)


def test_readers_find_decode_pipelines_through_the_registry(tmp_path: Path) -> None:
    """A pipeline registered for a decode op is what the loaders run: nothing in the
    reader or the loaders names the op's room."""
    from spark_dl_core.ops import registry as op_registry

    class Lengths:  # a decode pipeline: each clip's byte length, in a [B, 1] batch
        kind, on_device = "audio", False

        def __init__(self, op: object, column: str) -> None:
            self.column, self.crops = column, []

        def add(self, op: object) -> None:
            self.crops.append(op)

        def run(self, raws: list[bytes], key: bytes, index: np.ndarray, *_: object) -> object:
            return np.array([[len(r)] for r in raws], np.int64)

    write_mds(pa.table({"audio": [b"a" * n for n in (3, 5, 7)]}), str(tmp_path / "ds"))
    ops = [
        {"op": "audio_decode", "column": "audio"},
        {"op": "audio_crop", "column": "audio", "seconds": 1},
    ]
    saved = op_registry.implementation("audio_decode")
    op_registry.register_op("audio_decode", Lengths)
    try:
        batch = next(iter(open_dataset(tmp_path / "ds").iter_batches(batch_size=3, transforms=ops)))
    finally:
        op_registry.register_op("audio_decode", saved)
    assert batch["audio"].tolist() == [[3], [5], [7]]
