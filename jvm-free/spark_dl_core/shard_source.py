"""What a source of shards provides: the one contract the order, the reader and the loaders
hold every kind of source to.

Three kinds implement it: an MDS dataset (:class:`~spark_dl_core.sources.dataset.Dataset`),
a mixture of sources (:class:`~spark_dl_core.mixture.dataset.Mixture`), and a Delta snapshot
read in place. A source is a sequence of samples cut into shards: ``shard_offsets[i]`` is the
first global sample index of shard ``i``; the order shuffles shards and samples within them
by ``fingerprint``; the reader loads a shard (:meth:`ShardSource.load_shard`) and decodes
rows by ``layout``. Nothing here imports another room, so any room may type against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from .format.encodings import Encoding
    from .format.shard import Layout, ShardData


# A decoded batch: column name -> numpy array (object arrays for str / bytes / json), or a
# batch form of the format room (Jagged token documents, ImageList images of several sizes).
Batch = dict[str, Any]


class ShardSource(Protocol):
    """A source of shards (see the module docstring). Optional: ``make_order(seed, epoch,
    shuffle, window, batch_size)`` and ``order_uses_batch_size``, for a source whose order is
    not one dataset's (a mixture merges its sources' orders)."""

    @property
    def path(self) -> str:
        """Where it lives (a path, URI or a mixture's description)."""

    @property
    def shown(self) -> str:
        """``path`` as messages show it: credentials redacted."""

    @property
    def fingerprint(self) -> str:
        """Changes iff the content or the spec changes: keys the order and resume states."""

    @property
    def shard_offsets(self) -> np.ndarray:
        """``len(shards) + 1`` cumulative sample counts."""

    @property
    def shards(self) -> Any:
        """Per-shard facts (a :class:`~spark_dl_core.format.compact.ShardTable`)."""

    @property
    def layout(self) -> Layout:
        """Column names and encodings of every shard."""

    @property
    def columns(self) -> dict[str, str]:
        """Stored columns and their encodings' names."""

    @property
    def derived(self) -> tuple[str, ...]:
        """Columns computed from sample indices, not stored (a mixture's source column)."""

    @property
    def allow_unsafe(self) -> bool:
        """Whether code-running encodings (``pkl``) may be decoded."""

    @property
    def spec(self) -> dict[str, Any] | None:
        """The recorded spec (its read-time ops run on every read)."""

    @property
    def plans(self) -> list[Any] | None:
        """Each column's recorded Arrow type and null mask (None when none is recorded)."""

    @property
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """Each column's batch form (dense, jagged, objects) and fixed shape."""

    def __len__(self) -> int: ...

    def encoding(self, column: str) -> Encoding: ...

    def locate(self, sample: int) -> tuple[str, int]:
        """The shard file and local index of a global sample (for messages)."""

    def derive(self, name: str, index: np.ndarray) -> np.ndarray: ...

    def load_shard(
        self,
        shard: int,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> ShardData:
        """One shard's rows, checked (sizes, hashes) before any byte is parsed."""

    def read(
        self,
        indices: np.ndarray,
        columns: list[str] | None = None,
        images: Any = "bytes",
        verify_hashes: bool | None = None,
        loaded: dict[int, ShardData] | None = None,
        jagged: bool = False,
    ) -> Batch:
        """Decode samples by global index, in the order given."""

    def row_spans(
        self, data: ShardData, columns: list[str]
    ) -> tuple[int, list[tuple[int, int, Any]]] | None: ...

    def prefetch_shards(self, shards: list[int], threads: int | None = None) -> bool: ...

    def release_shards(self, shards: list[int]) -> None: ...

    def download_stats(self) -> dict[str, float] | None: ...
