"""Many keyed shuffles in one call (optional C extension, csrc/shuffle.c)."""

import numpy as np

def shuffle_slices(ids: np.ndarray, sizes: np.ndarray, words: np.ndarray) -> None: ...
