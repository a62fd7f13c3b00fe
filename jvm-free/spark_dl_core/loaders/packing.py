"""Packing token documents into fixed-length training sequences, at read time.

A step between the stored documents and the framework adapters. The epoch's *global*
document order (:mod:`spark_dl_core.order`: a pure function of fingerprint, seed, epoch and
shuffle settings, whatever the world size) is packed into a *global* stream of rows of
``seq_len`` tokens; the rows from the saved position on are cut into global batches of
``batch_size`` rows and global batch ``g`` goes to rank ``g % world_size`` (its ``j``-th
batch to DataLoader worker ``j % num_workers``), as :class:`~spark_dl_core.order.EpochPlan`
deals sample batches. So the packed sequences are the same on any world size and worker
count, every token is delivered exactly once per epoch, and a position is a count of
global rows: a resumed loader continues a document it had half delivered.

Documents are packed block by block, a block being one shuffle window's documents (with
``shuffle=False``, ``shuffle_window`` consecutive shards): what is held is one or two
blocks' shards and their documents' lengths and byte positions, never O(dataset).

This module is the loaders' face of packing (settings checked, states, a rank's plan);
:mod:`.packed_epoch` packs an epoch's documents into rows, :mod:`.packed_rows` cuts a
rank's batches from them.

Modes:

- ``concat``: documents in the epoch's order fill rows back to back and are split at row
  ends; only the epoch's last row is padded.
- ``bin``: a document of at most ``seq_len`` tokens is never split. Each ``window``
  consecutive documents are placed by best fit (the open row with the least room that
  holds the document, else a new row; ties to the older row); a longer document is first
  cut into full rows. Rows are delivered in the order they were opened; ``fill`` (real
  tokens / all tokens) is in the loader's ``stats()``.

Each batch holds ``input_ids``, ``labels`` and ``position_ids`` (int64 ``[B, seq_len]``:
the dtype torch's embeddings and ``cross_entropy`` take) and ``cu_seqlens`` (int32, the
flattened batch's segment boundaries from 0 to ``B * seq_len``, FlashAttention's varlen
convention) with ``max_seqlen`` (an int). A *segment* is one document's run of tokens in
one row (padding at a row's end is a segment too); ``position_ids`` count from each
document's first token (a document continued from the previous row keeps counting);
``labels`` equal ``input_ids`` except -100 at each segment's first token and at padding,
so that a model shifting labels by one (as Hugging Face's do) never predicts across
documents.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PackError
from ..order.locality import AUTO_STREAMS, stream_window
from .packed_epoch import EpochPacking
from .packed_rows import PackedPlan
from .packed_streams import StreamedPackedPlan, StreamedPacking, packed_streams
from .position import resumed, saved_state
from .settings import LoaderSettings, PackSpec

if TYPE_CHECKING:
    from ..shard_source import ShardSource

# Bumped whenever the same settings would pack other rows (a saved row count would mean
# other tokens); a state of another version is refused.
PACK_VERSION = 1
# Rows cut from streams (:mod:`.packed_streams`): the position counts global batches, and
# the state records the streams and the batch size they were dealt with. A loader that
# would stream resumes a version 1 state on the one run of rows it counts in (streams=1).
STREAMED_PACK_VERSION = 2

# A rank's packed batches: from one run of rows, or from streams.
AnyPackedPlan = PackedPlan | StreamedPackedPlan


def _tokenize_op(dataset: ShardSource, column: str) -> dict[str, Any] | None:
    """The recorded ``tokenize`` op that wrote ``column``, if any."""
    for op in (dataset.spec or {}).get("transforms", []):
        if op.get("op") == "tokenize" and op.get("output", "tokens") == column:
            return dict(op)
    return None


def check_pack(dataset: ShardSource, pack: PackSpec) -> PackSpec:
    """``pack`` checked against the dataset, with ``pad_id`` resolved: the column must be a
    1-D integer ndarray column; a ``pad_id`` that is an ordinary token of the column's
    recorded tokenizer (not a special token, below its vocabulary size) is refused, since a
    model or collator that masks labels by value would then mask real tokens."""
    column = pack.column
    if column not in dataset.layout.names:
        raise PackError(
            f"pack column {column!r} is not in {dataset.path}; it has {list(dataset.layout.names)}",
            field="column",
        )
    encoding = dataset.encoding(column)
    form = dataset.forms.get(column, ("", None))
    dtype = getattr(encoding, "dtype", None)
    one_d = form[0] in ("jagged", "auto") or (form[0] == "dense" and len(form[1] or ()) == 1)
    if (
        encoding.size is not None
        or not encoding.ndarray
        or not one_d
        or (dtype is not None and np.dtype(dtype).kind not in "iu")
    ):
        raise PackError(
            f"pack column {column!r} is {encoding.name}: packing needs token documents, a "
            "variable-length 1-D integer ndarray column (e.g. written by the tokenize op)",
            field="column",
        )
    op = _tokenize_op(dataset, column)
    pad = pack.pad_id
    if pad is None:
        pad = int(op["eos_id"]) if op and op.get("eos_id") is not None else 0
    elif op and op.get("vocab_size") is not None:
        special = {op.get("eos_id"), op.get("bos_id"), *(op.get("special_ids") or [])}
        if pad < int(op["vocab_size"]) and pad not in special:
            raise PackError(
                f"pack pad_id={pad} is an ordinary token of the tokenizer that wrote {column!r} "
                f"(vocabulary 0..{int(op['vocab_size']) - 1}); padding is masked in labels "
                "by position, but anything masking by value would hide real tokens: use a "
                f"special token's id (eos {op.get('eos_id')}) or an id >= {op['vocab_size']}",
                field="pad_id",
            )
    return pack.model_copy(update={"pad_id": pad})


def pack_state(pack: PackSpec, rows: int, streams: int = 1, batch_size: int = 0) -> dict[str, Any]:
    """The nested ``pack`` entry of a loader state: the settings rows are counted in; with
    ``streams > 1``, global batches of ``batch_size`` rows dealt over those streams."""
    if streams > 1:
        return {
            "settings": pack_key(pack),
            "batches": int(rows),
            "streams": int(streams),
            "batch_size": int(batch_size),
            "version": STREAMED_PACK_VERSION,
        }
    return {"settings": pack_key(pack), "rows": int(rows), "version": PACK_VERSION}


def pack_key(pack: PackSpec | None) -> dict[str, Any] | None:
    return None if pack is None else pack.model_dump(mode="json")


def state_rows(state: dict[str, Any] | None, pack: PackSpec) -> tuple[int, int]:
    """(position, streams) that a loader state's ``pack`` entry records: rows consumed
    (streams 1), or global batches over its streams; checked against ``pack`` (a state of
    other settings counts other rows: refused, naming the field)."""
    entry = (state or {}).get("pack")
    if not isinstance(entry, dict):
        raise PackError(
            "loader state has no pack position (it was saved by a loader without pack=); "
            "packed rows cannot resume from a document count",
            field="pack",
        )
    version = entry.get("version")
    if version not in (PACK_VERSION, STREAMED_PACK_VERSION):
        raise PackError(
            f"loader state has pack version {version!r}, this spark-dl packs versions "
            f"{PACK_VERSION} and {STREAMED_PACK_VERSION}",
            field="pack",
        )
    saved = entry.get("settings") or {}
    mine = pack_key(pack) or {}
    for name in sorted(set(saved) | set(mine)):
        if saved.get(name) != mine.get(name):
            raise PackError(
                f"loader state was saved with pack {name}={saved.get(name)!r}, the loader "
                f"has {name}={mine.get(name)!r}; pass the same pack settings to resume",
                field=f"pack.{name}",
            )
    what = "rows" if version == PACK_VERSION else "batches"
    at = entry.get(what)
    if not isinstance(at, int) or at < 0:
        raise PackError(f"loader state pack {what}={at!r} is not a count", field=f"pack.{what}")
    if version == PACK_VERSION:
        return at, 1
    streams = entry.get("streams")
    if not isinstance(streams, int) or streams < 2:
        raise PackError(f"loader state pack streams={streams!r} is not 2 or more", field="pack")
    return at, streams


def _adopt_streams(
    dataset: ShardSource, settings: LoaderSettings, state: dict[str, Any], streams: int
) -> LoaderSettings:
    """``settings`` reading on in the packing of a state recorded over ``streams`` streams
    (1: one run of rows): automatic streams take the state's; an explicit other number, a
    batch size or ``drop_last`` that deals other batches is refused, naming the setting."""
    if packed_streams(dataset, settings) != streams and settings.streams == AUTO_STREAMS:
        settings = settings.replace(streams=streams)
    have = packed_streams(dataset, settings)
    if have != streams:
        why = (
            "its rows were packed in one run (pack version 1)"
            if streams == 1
            else f"its rows were cut from {streams} streams"
        )
        raise PackError(
            f"loader state was saved with streams={streams}: {why}; this loader packs "
            f"{have} stream(s); pass streams={streams} to resume it exactly",
            field="streams",
        )
    saved, window = state.get("shuffle_window"), settings.shuffle_window
    if isinstance(saved, int) and (
        stream_window(saved, streams) != stream_window(window, streams)
        if streams > 1
        else saved != window
    ):  # the packing's own windows (the order's check compares the sample streams')
        raise PackError(
            f"loader state was saved with shuffle_window={saved}, the loader has "
            f"shuffle_window={window}: its packed rows are shuffled in other windows; pass "
            f"shuffle_window={saved} to resume",
            field="shuffle_window",
        )
    if streams > 1:
        for name in ("batch_size", "drop_last"):
            if state.get(name) != getattr(settings, name):
                raise PackError(
                    f"loader state was saved with {name}={state.get(name)!r}, the loader has "
                    f"{name}={getattr(settings, name)!r}: packed streams deal other batches "
                    f"with it; pass {name}={state.get(name)!r} to resume",
                    field=name,
                )
    return settings


def packed_source(dataset: ShardSource, settings: LoaderSettings) -> ShardSource:
    """The dataset a packed loader reads: a mixture whose schedule boundaries are in tokens
    has them placed at documents for this loader's column, seed and shuffle (cached)."""
    if settings.pack is None:
        return dataset
    placed: ShardSource = dataset.at_tokens(
        settings.pack.column, settings.seed, settings.shuffle, settings.verify_hashes
    )
    return placed


def packed_plan(
    dataset: ShardSource,
    settings: LoaderSettings,
    *,
    epoch: int,
    rows: int,
    rank: int,
    world_size: int,
) -> AnyPackedPlan:
    """A rank's plan for ``settings`` (with ``pack``): cut from streams where
    :func:`packed_streams` gives more than one (``rows`` then counts global batches), else
    a :class:`PackedPlan` over one run of rows."""
    dataset = packed_source(dataset, settings)
    pack = check_pack(dataset, settings.pack)
    streams = packed_streams(dataset, settings)
    if streams > 1:
        streamed = StreamedPacking(
            dataset,
            pack,
            seed=settings.seed,
            epoch=epoch,
            shuffle_window=settings.shuffle_window,
            streams=streams,
            batch_size=settings.batch_size,
            drop_last=settings.drop_last,
            verify_hashes=settings.verify_hashes,
        )
        return StreamedPackedPlan(
            streamed,
            rank,
            world_size,
            settings.drop_last,
            rows,
            even_batches=settings.even_batches,
            pad_mask=settings.pad_mask,
        )
    packing = EpochPacking(
        dataset,
        pack,
        seed=settings.seed,
        epoch=epoch,
        shuffle=settings.shuffle,
        shuffle_window=settings.shuffle_window,
        verify_hashes=settings.verify_hashes,
    )
    return PackedPlan(
        packing,
        settings.batch_size,
        rank,
        world_size,
        settings.drop_last,
        rows,
        even_batches=settings.even_batches,
        pad_mask=settings.pad_mask,
    )


def resume_position(
    dataset: ShardSource,
    settings: LoaderSettings,
    state: dict[str, Any] | None,
    strict: bool = True,
) -> tuple[ShardSource, int, int, LoaderSettings]:
    """(the dataset to read, epoch, position, the settings to read on with) of a packed
    loader: from ``state`` (checked against dataset, order and pack settings; ``strict=False``
    lets the dataset take a state of another version of it, if it can; the position counts
    rows, or global batches over streams, and the settings take the state's streams), else
    the settings' epoch from its start."""
    dataset = packed_source(dataset, settings)
    if state is None:
        return dataset, settings.epoch, 0, settings
    pack = check_pack(dataset, settings.pack)
    loaded, dataset, _, _ = resumed(dataset, settings, state, strict, pack=pack_key(pack))
    at, streams = state_rows(state, pack)
    settings = _adopt_streams(dataset, settings, state, streams)
    return dataset, loaded.epoch, at, settings


def iter_packed(
    dataset: ShardSource,
    settings: LoaderSettings,
    state: dict[str, Any] | None = None,
    strict: bool = True,
) -> Iterator[dict[str, Any]]:
    """numpy batches of packed rows for ``Dataset.iter_batches(pack=...)``; the settings
    and ``state`` are checked now, before the first batch."""
    dataset, epoch, rows, settings = resume_position(dataset, settings, state, strict)
    rank = 0 if settings.rank is None else settings.rank
    world = 1 if settings.world_size is None else settings.world_size
    plan = packed_plan(dataset, settings, epoch=epoch, rows=rows, rank=rank, world_size=world)
    return (batch for batch, _ in plan.batches())


def packed_state(
    dataset: ShardSource, settings: LoaderSettings, epoch: int, rows: int
) -> dict[str, Any]:
    """The loader state of a packed position (``consumed`` 0, rows or batches in ``pack``)."""
    dataset = packed_source(dataset, settings)
    pack = check_pack(dataset, settings.pack)
    streams = packed_streams(dataset, settings)
    entry = pack_state(pack, rows, streams, settings.batch_size)
    return saved_state(dataset, settings, epoch, 0, pack=entry)
