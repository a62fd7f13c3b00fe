"""Many byte-range and row copies in one call (optional C extension, csrc/buffers.c)."""

import numpy as np

def copy_ranges(
    out: np.ndarray, at: np.ndarray, src: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> None: ...
def gather_columns(
    out: np.ndarray,
    mats: list[np.ndarray | None],
    which: np.ndarray | None,
    local: np.ndarray,
    row: int,
    spans: list[tuple[int, int, bytes]],
) -> int: ...
