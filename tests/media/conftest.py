"""Datasets several media test modules read: 24 audio clips of every format, 4 H.264 clips."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from media_helpers import FORMATS, RATES, _encode, _tone, _video

from spark_dl_core import write_mds


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> str:
    """24 clips: 4 formats x rates 16-48 kHz, mono and stereo, 0.5 to 2.8 s."""
    clips, seconds = [], []
    for i in range(24):
        fmt, subtype = FORMATS[i % 4]
        rate, length = RATES[(i // 4) % 4], 0.5 + 0.1 * i
        clips.append(_encode(_tone(rate, length, 1 + i % 2), rate, fmt, subtype))
        seconds.append(length)
    table = pa.table({"id": np.arange(24), "audio": clips, "seconds": seconds})
    path = str(tmp_path_factory.mktemp("audio") / "ds")
    write_mds(table, path)
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> str:
    clips = [_video(n, 64 + 16 * (n % 2), 48) for n in (20, 25, 5, 30)]
    path = str(tmp_path_factory.mktemp("video") / "ds")
    write_mds(pa.table({"id": np.arange(4), "video": clips}), path)
    return path
