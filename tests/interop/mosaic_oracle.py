"""Mosaic Streaming as an interoperability oracle; run by the side environment's Python.

Never imported by the main environment: ``tests/interop/oracle.py`` starts this script with
the interpreter of ``.venv-mosaic`` (numpy<2.2, CPU torch, mosaicml-streaming) and exchanges
pickles of plain Python values with it, so neither side unpickles the other's numpy objects.

Plain values: ``None``, bool, int, float, str, bytes, ``Decimal``, lists, tuples and dicts of
those, plus two tagged dicts (key ``__plain__``)::

    {"__plain__": "ndarray", "dtype": "<f4", "shape": [2, 3], "data": b"..."}
    {"__plain__": "image", "mode": "RGB", "size": [w, h], "pixels": b"...",
     "encoded": b"..." or None, "format": "JPEG" or None}

Numpy scalars travel as 0-d ``ndarray`` tags. On ``write``, images are given as encoded bytes
(PNG or JPEG files' contents) and become PIL images where the column's encoding takes one
(``pil``, ``jpeg``, ``png``, ``list[...]``); ``jpeg`` images are opened from a file so that
Mosaic stores the given bytes unchanged, as it does for a JPEG file on disk. ``jpeg_array``
takes the encoded bytes themselves, as Mosaic's encoder does.

Subcommands::

    write OUT_DIR --spec spec.json --samples samples.pkl
    read DATA_DIR --out values.pkl [--validate-hash ALGO] [--allow-unsafe] [--no-remote]
    batch --jobs jobs.pkl --out results.pkl

``spec.json`` holds ``columns``, ``compression``, ``hashes`` and ``size_limit`` for
``MDSWriter``. ``read`` opens ``StreamingDataset`` with ``remote=DATA_DIR`` (a plain local
path: Mosaic copies each shard into a fresh per-call cache and checks ``validate_hash`` there,
leaving ``DATA_DIR`` untouched) or, with ``--no-remote``, with ``remote=None`` on a fresh copy
of ``DATA_DIR`` (Mosaic decompresses shards in place). Samples are read by index, ``0..n-1``.
``batch`` runs a list of jobs (dicts with ``op`` "write" or "read" and the arguments above)
in one process and stores, per job, its result or ``{"__error__": "Type: message"}``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import mosaic_shim

mosaic_shim.install()

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from streaming import MDSWriter, StreamingDataset  # noqa: E402

PLAIN = "__plain__"
ERROR = "__error__"
IMAGE_ENCODINGS = {"pil", "jpeg", "png"}
IMAGE_LIST_ENCODINGS = {"list[pil]": "pil", "list[jpeg]": "jpeg", "list[png]": "png"}


# ----------------------------------------------------------------------------- plain -> Mosaic


def from_plain(value: Any) -> Any:
    """Rebuild numpy arrays (and scalars) from ndarray tags, recursively."""
    if isinstance(value, dict):
        if value.get(PLAIN) == "ndarray":
            arr = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
            arr = arr.reshape(tuple(value["shape"])).copy()
            return arr[()] if arr.ndim == 0 else arr
        return {key: from_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(from_plain(item) for item in value)
    return value


class ImageOpener:
    """Turns encoded image bytes into PIL images; JPEGs through files Mosaic can re-read."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.files: dict[bytes, Path] = {}  # one file per distinct JPEG

    def open(self, data: bytes, encoding: str) -> Image.Image:
        if not isinstance(data, bytes):
            raise TypeError(f"{encoding} images must be given as encoded bytes, not {type(data)}")
        if encoding == "jpeg":
            path = self.files.get(data)
            if path is None:
                path = self.scratch / f"image{len(self.files):06d}.jpg"
                path.write_bytes(data)
                self.files[data] = path
            return Image.open(path)
        image = Image.open(BytesIO(data))
        image.load()
        return image


def to_mosaic_sample(
    sample: Mapping[str, Any], columns: Mapping[str, str], images: ImageOpener
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in sample.items():
        encoding = columns.get(name)
        value = from_plain(raw)
        if encoding in IMAGE_ENCODINGS:
            value = images.open(value, encoding)
        elif encoding in IMAGE_LIST_ENCODINGS:
            value = [images.open(item, IMAGE_LIST_ENCODINGS[encoding]) for item in value]
        out[name] = value
    return out


def write(
    out_dir: str,
    columns: Mapping[str, str],
    samples: Sequence[Mapping[str, Any]],
    compression: str | None = None,
    hashes: Sequence[str] | None = None,
    size_limit: int | str | None = None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"columns": dict(columns), "out": out_dir}
    if compression is not None:
        kwargs["compression"] = compression
    if hashes is not None:
        kwargs["hashes"] = list(hashes)
    if size_limit is not None:
        kwargs["size_limit"] = size_limit
    with tempfile.TemporaryDirectory(prefix="mosaic-images-") as scratch:
        images = ImageOpener(Path(scratch))
        with MDSWriter(**kwargs) as writer:
            for sample in samples:
                writer.write(to_mosaic_sample(sample, columns, images))
    return {"files": sorted(path.name for path in Path(out_dir).iterdir())}


# ----------------------------------------------------------------------------- Mosaic -> plain


def image_to_plain(image: Image.Image) -> dict[str, Any]:
    encoded = None
    source = getattr(image, "fp", None)
    if isinstance(source, BytesIO):
        encoded = source.getvalue()
    return {
        PLAIN: "image",
        "mode": image.mode,
        "size": list(image.size),
        "pixels": image.tobytes(),
        "encoded": encoded,
        "format": image.format,
    }


def to_plain(value: Any) -> Any:
    """Mosaic's decoded values as plain values (see the module docstring)."""
    if isinstance(value, Image.Image):
        return image_to_plain(value)
    if isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            return [to_plain(item) for item in arr.tolist()]
        return {PLAIN: "ndarray", "dtype": arr.dtype.str, "shape": list(arr.shape),
                "data": arr.tobytes()}  # fmt: skip
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_plain(item) for item in value)
    return value


def read(
    data_dir: str,
    validate_hash: str | None = None,
    allow_unsafe: bool = False,
    remote: bool = True,
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="mosaic-cache-") as scratch:
        local = Path(scratch) / "local"
        if remote:
            local.mkdir()
            source: str | None = str(Path(data_dir).resolve())
        else:
            shutil.copytree(data_dir, local)
            source = None
        dataset = StreamingDataset(
            remote=source,
            local=str(local),
            shuffle=False,
            batch_size=1,
            validate_hash=validate_hash,
            allow_unsafe_types=allow_unsafe,
        )
        try:
            return [to_plain(dataset[index]) for index in range(dataset.num_samples)]
        finally:
            del dataset


# ----------------------------------------------------------------------------- command line


def run_job(job: Mapping[str, Any]) -> Any:
    op = job["op"]
    if op == "write":
        return write(
            job["out"],
            job["columns"],
            job["samples"],
            compression=job.get("compression"),
            hashes=job.get("hashes"),
            size_limit=job.get("size_limit"),
        )
    if op == "read":
        return read(
            job["data"],
            validate_hash=job.get("validate_hash"),
            allow_unsafe=bool(job.get("allow_unsafe", False)),
            remote=bool(job.get("remote", True)),
        )
    raise ValueError(f"unknown job op {op!r}")


def run_batch(jobs: Sequence[Mapping[str, Any]]) -> list[Any]:
    results: list[Any] = []
    for job in jobs:
        try:
            results.append(run_job(job))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            results.append({ERROR: f"{type(exc).__name__}: {exc}"})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write_cmd = commands.add_parser("write", help="write samples with MDSWriter")
    write_cmd.add_argument("out_dir")
    write_cmd.add_argument("--spec", required=True, help="JSON: columns, compression, ...")
    write_cmd.add_argument("--samples", required=True, help="pickle: list of plain samples")
    read_cmd = commands.add_parser("read", help="read every sample with StreamingDataset")
    read_cmd.add_argument("data_dir")
    read_cmd.add_argument("--out", required=True, help="pickle: list of plain samples")
    read_cmd.add_argument("--validate-hash", default=None)
    read_cmd.add_argument("--allow-unsafe", action="store_true")
    read_cmd.add_argument("--no-remote", action="store_true")
    batch_cmd = commands.add_parser("batch", help="run a pickled list of jobs")
    batch_cmd.add_argument("--jobs", required=True)
    batch_cmd.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    if args.command == "write":
        spec = json.loads(Path(args.spec).read_text())
        samples = pickle.loads(Path(args.samples).read_bytes())
        write(
            args.out_dir,
            spec["columns"],
            samples,
            compression=spec.get("compression"),
            hashes=spec.get("hashes"),
            size_limit=spec.get("size_limit"),
        )
    elif args.command == "read":
        values = read(
            args.data_dir,
            validate_hash=args.validate_hash,
            allow_unsafe=args.allow_unsafe,
            remote=not args.no_remote,
        )
        Path(args.out).write_bytes(pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL))
    else:
        jobs = pickle.loads(Path(args.jobs).read_bytes())
        results = run_batch(jobs)
        Path(args.out).write_bytes(pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
