"""One side process a run, in which Mosaic writes the datasets of two test modules."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def side_written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One side process: Mosaic writes (a) and (c) datasets and reads one of (a) back."""
    from mosaic_helpers import (  # here: the other format tests need none of this data
        MOSAIC_COLUMNS,
        MOSAIC_CONFIGS,
        MOSAIC_SAMPLES,
        SAME_BYTES_COLUMNS,
        SAME_BYTES_COMPRESSIONS,
        SAME_BYTES_HASHES,
        SAME_BYTES_SIZE_LIMIT,
        SIZE_LIMIT,
        _config_id,
        oracle,
        same_bytes_mosaic_samples,
    )

    oracle.require_mosaic()
    root = tmp_path_factory.mktemp("mosaic-written")
    jobs = [
        oracle.write_job(
            root / f"a-{_config_id(config)}",
            MOSAIC_COLUMNS,
            MOSAIC_SAMPLES,
            compression=config[0],
            hashes=config[1],
            size_limit=SIZE_LIMIT,
        )
        for config in MOSAIC_CONFIGS
    ]
    jobs.append(oracle.read_job(root / f"a-{_config_id(MOSAIC_CONFIGS[0])}", allow_unsafe=True))
    for compression in SAME_BYTES_COMPRESSIONS:
        jobs.append(
            oracle.write_job(
                root / f"c-{compression or 'raw'}",
                SAME_BYTES_COLUMNS,
                same_bytes_mosaic_samples(),
                compression=compression,
                hashes=SAME_BYTES_HASHES,
                size_limit=SAME_BYTES_SIZE_LIMIT,
            )
        )
    results = oracle.mosaic_batch(jobs)
    return {"root": root, "mosaic_read": results[len(MOSAIC_CONFIGS)]}
