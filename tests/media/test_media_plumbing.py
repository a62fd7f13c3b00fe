"""What audio and video share: bad ops and bytes refused, decoder imports in the loader."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from media_helpers import OPS

from spark_dl_core import SpecError, open_dataset, write_mds

pytest.importorskip("soundfile")
pytest.importorskip("av")


def test_bad_media_ops_and_bytes_are_refused_naming_column(
    audio: str, video: str, tmp_path: Path
) -> None:
    ds = open_dataset(audio)
    crop = {"op": "audio_crop", "column": "audio", "seconds": 1.0}
    with pytest.raises(SpecError, match="audio_crop on column 'audio' needs an audio_decode of it"):
        ds.to_torch(batch_size=4, transforms=[crop])
    with pytest.raises(SpecError, match=r"audio_decode on column 'seconds'.*not encoded bytes"):
        ds.to_torch(batch_size=4, transforms=[{"op": "audio_decode", "column": "seconds"}])
    with pytest.raises(SpecError, match="seconds"):
        ds.to_torch(batch_size=4, transforms=[{**OPS[0]}, {**crop, "seconds": 0}])
    cast = {"op": "cast", "column": "video", "to": "float32"}
    with pytest.raises(
        SpecError, match="cast on video column 'video': video columns take normalize"
    ):
        open_dataset(video).to_torch(
            batch_size=2, transforms=[{"op": "video_decode", "column": "video"}, cast]
        )
    from spark_dl_core.media.clips import MediaError

    broken = str(tmp_path / "broken")
    write_mds(pa.table({"id": [0, 1], "audio": [b"RIFF-not-really", b"\x00" * 10]}), broken)
    with pytest.raises(MediaError, match=r"column 'audio', shard .*shard\.00000\.mds.*sample 0"):
        list(open_dataset(broken).iter_batches(batch_size=2, transforms=OPS))


def test_decoder_libraries_and_numpy_ma_load_where_the_loader_is_built(audio: str) -> None:
    """DataLoader workers are forked for every pass: what they import costs every pass."""
    import subprocess
    import sys

    code = (
        "import sys; from spark_dl_core import open_dataset; "
        f"open_dataset({audio!r}).to_torch(batch_size=4, num_workers=2, transforms={OPS!r}); "
        "print(sorted(m for m in ('soundfile', 'soxr', 'numpy.ma') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "['numpy.ma', 'soundfile', 'soxr']"
