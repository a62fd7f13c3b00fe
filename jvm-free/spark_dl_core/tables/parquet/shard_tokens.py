"""A token column's values per row group as the Parquet footers record them, so that a packed
``concat`` loader over a table read in place counts its rows without reading a row group and
cuts them from streams (each rank reads only its streams' row groups: ``loaders/
packed_streams``), as over an MDS dataset whose ``spark_dl.json`` records them.

A footer gives each row group's leaf count of a list column (``num_values``), which is that
row group's tokens only when every stored row is served as stored: no row left out (deletion
vectors, position or equality deletes, a ``filter=``, the rows a ``since=`` read keeps of a
rewritten file), no null or empty list nor null token (each counts one null leaf: the count is
then unknown), no write transform (the rows served are not the rows stored). Anything else:
None, and the loader reads the row groups' documents to count (pack version 1). A count that
is wrong all the same (a writer's statistics) is caught when the row group is read
(``loaders/packed_epoch``), before any row is cut from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from ...format.encoding_base import Encoding
    from ...meta import ColumnPlan


def footer_tokens(
    served: Sequence[tuple[int, int]],
    leaf_counts: Sequence[tuple[int, int]] | None,
    plan: ColumnPlan | None,
    encoding: Encoding | None,
    transformed: bool,
) -> np.ndarray | None:
    """Per served row group (``served``: its stored and live rows, in order), the values of
    the list-of-integers column ``plan`` stored as a variable ndarray (``encoding``), from
    ``leaf_counts``: every row
    group's (rows, leaf values) of every data file, in file order, empty ones included. None
    when a count is not exactly the served rows' values (see the module)."""
    if plan is None or encoding is None or leaf_counts is None or transformed:
        return None
    t = plan.arrow_type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return None
    if not pa.types.is_integer(t.value_type) or encoding.size is not None or not encoding.ndarray:
        return None
    # Row groups holding rows, in file order: the served ones exactly when none was emptied
    # by deletes or a filter (then every served row group is one of them, in the same order).
    stored = [(rows, values) for rows, values in leaf_counts if rows]
    if len(stored) != len(served):
        return None
    out = np.empty(len(served), dtype=np.int64)
    for k, ((group_rows, live), (rows, values)) in enumerate(zip(served, stored)):
        if values < 0 or rows != group_rows or live != group_rows:
            return None
        out[k] = values
    out.flags.writeable = False
    return out
