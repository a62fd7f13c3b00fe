"""What a source of shards provides: the one contract the order, the reader and the loaders
hold every kind of source to.

Every kind implements it through the shared base
:class:`~spark_dl_core.sources.dataset.Dataset`: an MDS dataset
(:class:`~spark_dl_core.sources.mds.MdsDataset`), a table read in place (Delta, Iceberg), and a
mixture of sources (:class:`~spark_dl_core.mixture.dataset.Mixture`). A source is a sequence of
samples cut into shards: ``shard_offsets[i]`` is the first global sample index of shard ``i``;
the order shuffles shards and samples within them by ``fingerprint``; the reader loads a shard
(:meth:`ShardSource.load_shard`) and decodes rows by ``layout``. Nothing here imports another
room, so any room may type against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from .format.encodings import Encoding
    from .format.shard import Layout, ShardData


# A decoded batch: column name -> numpy array (object arrays for str / bytes / json), or a
# batch form of the format room (Jagged token documents, ImageList images of several sizes).
Batch = dict[str, Any]


class ShardSource(Protocol):
    """A source of shards (see the module docstring). The optional parts, with a plain
    dataset's answers, are :class:`SourceCapabilities`' (every kind derives from it)."""

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

    def load_rows(
        self,
        shard: int,
        rows: np.ndarray,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
        decoded_only: bool = False,
    ) -> ShardData | None:
        """Only ``rows`` of ``shard``, sooner than the whole shard (None: load the shard)."""

    def decode_ahead(self, shards: list[int]) -> list[int]:
        """Decode these shards now, for DataLoader workers forked next (those it holds)."""

    def forget_decoded(self) -> None: ...

    # -- the optional parts (:class:`SourceCapabilities` gives each a plain dataset's answer)

    @property
    def orders_itself(self) -> bool: ...

    @property
    def order_uses_batch_size(self) -> bool: ...

    @property
    def streams_own_order(self) -> bool: ...

    @property
    def serves_rows(self) -> bool: ...

    def auto_streams(self) -> int: ...

    def make_order(
        self, seed: int, epoch: int, shuffle: bool, window: int, batch_size: int, streams: int = 1
    ) -> Any: ...

    @property
    def carry_on(self) -> Callable[[Any, bool], tuple[Any, int, int]] | None: ...

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any] | None: ...

    def row_layout(self) -> Any: ...

    def carry_report(self) -> dict[str, Any] | None: ...

    def epoch_total(self, epoch: int) -> int: ...

    def epoch_start(self, epoch: int) -> int: ...

    def at_tokens(
        self, column: str, seed: int, shuffle: bool, verify: bool | None = None
    ) -> Any: ...

    def count_sources(self, ids: np.ndarray) -> np.ndarray | None: ...

    def shard_values(self, column: str) -> np.ndarray | None: ...

    def doc_lengths(self, column: str, shards: Sequence[int]) -> list[np.ndarray] | None: ...

    def in_place_record(self) -> tuple[str, dict[str, Any]] | None: ...

    def source_report(self, counts: np.ndarray, epoch: int, consumed: int) -> dict[str, Any]: ...


@runtime_checkable
class TableSnapshot(Protocol):
    """What a mixture's ``Source(...)`` may hold besides a dataset or a path: a pinned table
    snapshot, which gives itself as a source read in place (its ``dataset()``)."""

    @property
    def shown(self) -> str:
        """How messages and mixtures name it."""

    def dataset(self, spec: Any = None, **options: Any) -> Any: ...


class SourceCapabilities:
    """The optional parts of :class:`ShardSource`, each with a plain dataset's answer. Every
    kind of source derives from this (through the shared base ``Dataset``) and overrides what
    it does otherwise, so the order, the loaders and resume read these directly: nothing probes a
    source for what it can do."""

    # The source makes its own order (:meth:`make_order`: a mixture merging its sources',
    # a run carried on finishing the old version's epoch) instead of one dataset's shuffle.
    orders_itself: bool = False
    # That order depends on the batch size (a stratified or per-source mixture).
    order_uses_batch_size: bool = False
    # That order can be drawn from fixed streams of its shards (a mixture: each source's cut
    # into the same streams), so ``make_order`` takes ``streams`` and ``auto_streams`` says
    # what ``streams=0`` means for it.
    streams_own_order: bool = False
    # A batch may take some rows of a shard before the whole shard is loaded
    # (``load_rows``: a table read in place, whose row groups are converted on first use).
    serves_rows: bool = False

    def auto_streams(self) -> int:
        """The streams ``streams=0`` gives this source's own order: 1 (no streams)."""
        return 1

    def make_order(
        self, seed: int, epoch: int, shuffle: bool, window: int, batch_size: int, streams: int = 1
    ) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no order of its own")

    @property
    def carry_on(self) -> Callable[[Any, bool], tuple[Any, int, int]] | None:
        """What takes a loader state saved over another version of this source:
        ``carry_on(state, strict) -> (source to read, epoch, consumed)``. None: a state must
        be this very source's (its fingerprint)."""
        return None

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any] | None:
        """What a loader state records of a position besides (epoch, consumed): a
        mixture's stream positions, a table version. None: nothing."""
        return None

    def row_layout(self) -> Any:
        """Each sample's (data file, row), for a run carried on across versions (a
        ``RowLayout``); None for a source whose samples are not rows of data files."""
        return None

    def carry_report(self) -> dict[str, Any] | None:
        """What a run carried on did with the old epoch's rows (a loader's
        ``stats()["carry"]``); None when no run was carried on."""
        return None

    def epoch_total(self, epoch: int) -> int:
        """Samples in ``epoch``: all of them, unless epochs differ in size (the epoch in
        which a run carried on to another version)."""
        return len(self)  # type: ignore[arg-type]

    def epoch_start(self, epoch: int) -> int:
        """The position a pass of ``epoch`` from its start begins at (0, unless the
        epoch's first positions were another version's samples)."""
        return 0

    def at_tokens(self, column: str, seed: int, shuffle: bool, verify: bool | None = None) -> Any:
        """This source as a packed loader reading ``column`` with ``seed`` and ``shuffle``
        sees it: itself, unless its schedule's boundaries are in tokens (a mixture places
        them at documents)."""
        return self

    def shard_values(self, column: str) -> np.ndarray | None:
        """Per shard, the values of list-of-integers ``column`` as its metadata records
        them (a shard's tokens, for a packed loader to count rows without reading it);
        None when not every shard's are recorded."""
        return None

    def doc_lengths(self, column: str, shards: Sequence[int]) -> list[np.ndarray] | None:
        """Per shard of ``shards``, each sample's count of list-of-integers ``column``'s
        values as recorded beside the shard (a packed loader's document lengths, without
        reading the shard); None when not every shard's are recorded."""
        return None

    def count_sources(self, ids: np.ndarray) -> np.ndarray | None:
        """Per source of a mixture, how many of global sample ``ids`` it gives (what
        ``loader.stats()`` shows); None for one dataset, which has no sources."""
        return None

    def source_report(self, counts: np.ndarray, epoch: int, consumed: int) -> dict[str, Any]:
        """``loader.stats()``'s view of a mixture at a position: per-source ``counts`` by
        name and the stage; nothing for one dataset."""
        return {}

    def in_place_record(self) -> tuple[str, dict[str, Any]] | None:
        """How a saved mixture opens this source again when it is a table read in place:
        (the kind of table, the arguments its reopening takes; see ``tables/kinds``). None:
        a dataset, which its path reopens."""
        return None
