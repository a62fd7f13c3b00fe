"""bin packing's best fit (optional C extension, csrc/packing.c)."""

import numpy as np

def best_fit(
    full: np.ndarray,
    rest: np.ndarray,
    seq_len: int,
    window: int,
    first_full: np.ndarray,
    place: np.ndarray,
) -> int: ...
