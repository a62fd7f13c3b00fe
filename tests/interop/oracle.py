"""Main-environment side of the Mosaic Streaming oracle (see ``mosaic_oracle.py``).

Runs ``tests/interop/mosaic_oracle.py`` with the side environment's interpreter
(``$SPARK_DL_MOSAIC_PYTHON``, default ``<repo>/.venv-mosaic/bin/python``, built by
``make mosaic-env``) and converts values between the two environments as plain Python
values. Tests call :func:`require_mosaic` first: a missing side environment skips them
locally and fails them under CI (``CI`` set).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPT = HERE / "mosaic_oracle.py"
PLAIN = "__plain__"
ERROR = "__error__"
BUILD_HINT = "build it with `make mosaic-env` (or set SPARK_DL_MOSAIC_PYTHON)"
# torch.distributed settings a test runner may carry; Mosaic would take them as its world.
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_S = 300


class MosaicOracleError(RuntimeError):
    """Mosaic (or the oracle script) failed; the message carries Mosaic's error."""


@dataclass(frozen=True)
class MosaicImage:
    """A PIL image as Mosaic decoded it: mode, (width, height), raw pixels, stored bytes."""

    mode: str
    size: tuple[int, int]
    pixels: bytes = field(repr=False)
    encoded: bytes | None = field(repr=False)
    format: str | None

    def array(self) -> np.ndarray:
        """The pixels as ``np.asarray(PIL image)`` gives them (HWC uint8 for RGB)."""
        from PIL import Image

        return np.asarray(Image.frombytes(self.mode, self.size, self.pixels))


def mosaic_python() -> Path | None:
    """The side environment's interpreter, or ``None`` when it is not built."""
    configured = os.environ.get("SPARK_DL_MOSAIC_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-mosaic" / "bin" / "python"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_mosaic() -> Path:
    """The side interpreter; skip the test without it, or fail it under CI."""
    python = mosaic_python()
    if python is None:
        message = f"Mosaic Streaming side environment not found: {BUILD_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


# ----------------------------------------------------------------------------- conversions


def to_plain(value: Any) -> Any:
    """Numpy arrays and scalars as ndarray tags, recursively; other values unchanged."""
    if isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot cross to the Mosaic environment")
        return {
            PLAIN: "ndarray",
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "data": arr.tobytes(),
        }
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_plain(item) for item in value)
    return value


def from_plain(value: Any) -> Any:
    """Rebuild numpy arrays (0-d ones as numpy scalars) and :class:`MosaicImage`s."""
    if isinstance(value, dict):
        tag = value.get(PLAIN)
        if tag == "ndarray":
            arr = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
            arr = arr.reshape(tuple(value["shape"])).copy()
            return arr[()] if arr.ndim == 0 else arr
        if tag == "image":
            width, height = value["size"]
            return MosaicImage(
                value["mode"], (width, height), value["pixels"], value["encoded"], value["format"]
            )
        return {key: from_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(from_plain(item) for item in value)
    return value


# ----------------------------------------------------------------------------- jobs


def write_job(
    out_dir: str | os.PathLike[str],
    columns: Mapping[str, str],
    samples: Sequence[Mapping[str, Any]],
    compression: str | None = None,
    hashes: Sequence[str] | None = None,
    size_limit: int | str | None = None,
) -> dict[str, Any]:
    """A job for :func:`mosaic_batch`: write ``samples`` with Mosaic's ``MDSWriter``."""
    return {
        "op": "write",
        "out": str(out_dir),
        "columns": dict(columns),
        "samples": to_plain(list(samples)),
        "compression": compression,
        "hashes": list(hashes) if hashes is not None else None,
        "size_limit": size_limit,
    }


def read_job(
    data_dir: str | os.PathLike[str],
    validate_hash: str | None = None,
    allow_unsafe: bool = False,
    remote: bool = True,
) -> dict[str, Any]:
    """A job for :func:`mosaic_batch`: read every sample with Mosaic's ``StreamingDataset``."""
    return {
        "op": "read",
        "data": str(data_dir),
        "validate_hash": validate_hash,
        "allow_unsafe": allow_unsafe,
        "remote": remote,
    }


def mosaic_batch(jobs: Sequence[Mapping[str, Any]], *, check: bool = True) -> list[Any]:
    """Run jobs in order in one side process; results in the main environment's terms.

    With ``check`` a failed job raises :class:`MosaicOracleError`; without it the failed
    job's result is that error (the following jobs still run).
    """
    python = require_mosaic()
    with tempfile.TemporaryDirectory(prefix="mosaic-oracle-") as scratch:
        work = Path(scratch)
        jobs_file, out_file, tmp = work / "jobs.pkl", work / "results.pkl", work / "tmp"
        tmp.mkdir()
        jobs_file.write_bytes(pickle.dumps(list(jobs), protocol=pickle.HIGHEST_PROTOCOL))
        env = {key: value for key, value in os.environ.items() if key not in DIST_VARS}
        env["TMPDIR"] = str(tmp)  # Mosaic's file locks live in the temp dir: keep them per call
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [str(python), str(SCRIPT), "batch", "--jobs", str(jobs_file), "--out", str(out_file)],
            cwd=str(work),
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0 or not out_file.exists():
            raise MosaicOracleError(
                f"Mosaic oracle exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
            )
        raw = pickle.loads(out_file.read_bytes())
    results: list[Any] = []
    for job, result in zip(jobs, raw, strict=True):
        if isinstance(result, dict) and ERROR in result:
            error = MosaicOracleError(f"Mosaic {job['op']} failed: {result[ERROR]}")
            if check:
                raise error
            results.append(error)
        else:
            results.append(from_plain(result))
    return results


def mosaic_write(
    out_dir: str | os.PathLike[str],
    columns: Mapping[str, str],
    samples: Sequence[Mapping[str, Any]],
    compression: str | None = None,
    hashes: Sequence[str] | None = None,
    size_limit: int | str | None = None,
) -> None:
    """Write ``samples`` to ``out_dir`` with Mosaic's ``MDSWriter``.

    Sample values: Python scalars, str, bytes, ``Decimal``, numpy arrays, JSON-able values;
    images (``pil``/``jpeg``/``png`` and ``list[...]`` of them, ``jpeg_array``) as encoded
    bytes.
    """
    mosaic_batch([write_job(out_dir, columns, samples, compression, hashes, size_limit)])


def mosaic_read(
    data_dir: str | os.PathLike[str],
    validate_hash: str | None = None,
    allow_unsafe: bool = False,
    remote: bool = True,
) -> list[dict[str, Any]]:
    """Every sample of ``data_dir`` as Mosaic's ``StreamingDataset`` decodes it, in order.

    Numpy values come back as numpy values; PIL images as :class:`MosaicImage`.
    """
    (values,) = mosaic_batch([read_job(data_dir, validate_hash, allow_unsafe, remote)])
    return list(values)
