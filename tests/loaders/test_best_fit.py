"""bin packing's best fit in C (csrc/packing.c) places every document where the Python loop
does, on random documents, windows and row lengths, and refuses what the loop cannot take."""

from __future__ import annotations

import numpy as np
import pytest

from spark_dl_core.loaders import packed_epoch
from spark_dl_core.loaders.packed_epoch import _best_fit, _best_fit_loop, bin_rows, pack_bin

_packing = pytest.importorskip(
    "spark_dl_core.loaders._packing", reason="the C extension was not built (no compiler)"
)


@pytest.mark.parametrize("seed", range(40))
def test_the_c_loop_places_every_document_as_the_python_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    seq_len = int(rng.choice([1, 2, 7, 64, 2048]))
    window = int(rng.choice([1, 2, 3, 16, 1024, 10**6]))
    n = int(rng.integers(0, 3000))
    top = int(rng.choice([1, seq_len, 3 * seq_len + 5]))
    lengths = rng.integers(0, top + 1, size=n)
    full, rest = np.divmod(lengths.astype(np.int64), seq_len)
    got = _best_fit(full, rest, seq_len, window)
    want = _best_fit_loop(full, rest, seq_len, window)
    assert got[2] == want[2]
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_ties_go_to_the_older_row_and_exact_fits_close_it() -> None:
    # rows of 10: [6] opens row 0 (room 4), [6] row 1 (room 4), [4] fills row 0 exactly
    # (the older of two rows with room 4), [3] fits row 1 (room 4 -> 1), [1] fills row 1
    lengths = np.array([6, 6, 4, 3, 1])
    full, rest = np.divmod(lengths, 10)
    _, place, opened = _best_fit(full, rest, 10, 100)
    assert opened == 2
    assert (place // 11).tolist() == [0, 1, 0, 1, 1] and (place % 11).tolist() == [0, 0, 6, 6, 9]
    assert bin_rows(lengths, 10, 100) == 2 and pack_bin(lengths, 0, 10, 100)[1] == 2


def test_bad_input_is_refused_by_name() -> None:
    full, rest = np.zeros(3, np.int64), np.array([1, 12, 2], np.int64)  # 12 >= seq_len
    with pytest.raises(ValueError, match="rest < seq_len"):
        _packing.best_fit(full, rest, 10, 4, np.zeros(3, np.int64), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="one length"):
        _packing.best_fit(full, rest[:2], 10, 4, np.zeros(3, np.int64), np.zeros(3, np.int64))


def test_without_the_extension_the_python_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = np.random.default_rng(3).integers(0, 100, size=500)
    with_c = pack_bin(lengths, 5, 32, 64)
    monkeypatch.setattr(packed_epoch, "_packing", None)
    without = pack_bin(lengths, 5, 32, 64)
    assert with_c[1] == without[1]
    for a, b in zip(vars(with_c[0]).values(), vars(without[0]).values()):
        assert np.array_equal(a, b)
