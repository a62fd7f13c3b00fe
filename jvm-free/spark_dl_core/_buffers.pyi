"""Many byte-range copies in one call (optional C extension, csrc/buffers.c)."""

import numpy as np

def copy_ranges(
    out: np.ndarray, at: np.ndarray, src: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> None: ...
