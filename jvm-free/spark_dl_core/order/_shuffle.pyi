"""Keyed shuffles and the order's window permutation (optional C extension, csrc/shuffle.c)."""

from collections.abc import Sequence

import numpy as np

def shuffle_slices(ids: np.ndarray, sizes: np.ndarray, words: np.ndarray) -> None: ...
def permute_range(out: np.ndarray, key: int) -> None: ...
def permute_span(out: np.ndarray, start: int, n: int, key: int) -> None: ...
def window_permute(
    positions: np.ndarray, sizes: np.ndarray, keys: np.ndarray, out: np.ndarray
) -> None: ...
def runs_to_ids(values: np.ndarray, bounds: np.ndarray, shifts: np.ndarray) -> None: ...
def shards_of(
    index: np.ndarray,
    offsets: np.ndarray,
    table: np.ndarray | None,
    shift: int,
    out: np.ndarray,
    seen: np.ndarray,
) -> list[int]: ...
def interleave_shuffle(
    out: np.ndarray, parts: Sequence[np.ndarray], lengths: np.ndarray, words: np.ndarray
) -> None: ...
