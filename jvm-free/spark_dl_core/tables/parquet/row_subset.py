"""Some rows of a row group, encoded as MDS shard bytes alone, standing in for the whole
converted row group in the batches that asked for them.

Why: with empty caches, the first batches of a table read in place would wait for every row
group of the first shuffle window to be decoded *and* converted whole (about half the
CPU before the first batch, on 500k-row groups of ragged ``list<float>`` rows). A batch
needs a few hundred rows of each: :meth:`.in_place.InPlaceDataset.load_rows` encodes just
those, from the row group's decoded table, while the whole conversion goes on for later
batches. Each row's bytes are those the whole conversion gives it (an MDS sample's bytes
depend on its own values only), so the decoded batch is the same.

A :class:`RowSubset` answers by the row group's local row numbers, as the whole shard does;
a row it does not hold is refused (:class:`~spark_dl_core.errors.SampleIndexError`), never
read from another row's bytes. It offers no row matrix: the reader decodes such batches
by the general path.
"""

from __future__ import annotations

import numpy as np

from ...errors import SampleIndexError
from ...format.buffers import Pieces
from ...format.shard import Layout, ShardData


class RowSubset(ShardData):
    """The rows ``rows`` (ascending local row numbers of a row group of ``total`` rows) of a
    shard, from ``raw``: the MDS bytes of those rows alone, in that order."""

    def __init__(
        self, raw: np.ndarray, file: str, layout: Layout, rows: np.ndarray, total: int
    ) -> None:
        # Not ShardData.__init__: this object's indices are the row group's, the held
        # shard's are positions in ``rows``; every method maps one to the other.
        self._held = ShardData(raw, file, layout, len(rows))
        self.raw, self.file, self.layout = raw, file, layout
        self.rows = np.asarray(rows, dtype=np.int64)
        self.count = int(total)

    def _positions_of(self, index: np.ndarray) -> np.ndarray:
        """Where the row group's rows ``index`` lie in the held shard; refused when one
        was not read."""
        index = np.asarray(index, dtype=np.int64)
        at = np.searchsorted(self.rows, index)
        if len(index):
            inside = at < len(self.rows)
            if not inside.all() or np.any(self.rows[at] != index):
                missing = index[~inside] if not inside.all() else index[self.rows[at] != index]
                raise SampleIndexError(
                    f"{self.file}: row {int(missing[0])} was not read for this batch "
                    f"(only {len(self.rows)} of its {self.count} rows were)"
                )
        return at

    @property
    def row_matrix(self) -> np.ndarray | None:
        return None  # the reader's row gather indexes a matrix by the row group's rows

    def gather_rows(self, local: np.ndarray, out: np.ndarray) -> None:
        self._held.gather_rows(self._positions_of(local), out)

    def columns(self, index: np.ndarray, names: list[str]) -> dict[str, Pieces]:
        return self._held.columns(self._positions_of(index), names)

    def positions(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._held.positions(self._positions_of(index))
