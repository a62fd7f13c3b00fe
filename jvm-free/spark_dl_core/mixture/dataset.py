"""The mixture as a dataset: several sources read as one, each giving an exact number of
samples per epoch.

Once opened (:func:`~.open.mix`, :func:`~.open.open_mixture`), a
:class:`Mixture` is a second kind of dataset for the order and the reader: its samples are
the sources' samples back to back in one id space, its shards the sources' shards, and its
order (:class:`~spark_dl_core.order.MixtureOrder`) picks each source's share of an epoch.
Every loader (``iter_batches``, ``to_torch``, ``to_tf``) and its resume state works on it
unchanged. Its spec and weight rules live in :mod:`.spec`, its columns' checks in
:mod:`.columns`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import MixtureError
from ..format.compact import ShardTable
from ..format.encodings import Encoding, get_encoding
from ..format.shard import ShardData
from ..meta import ColumnPlan
from ..order import (
    MixtureOrder,
    MixturePlan,
    ScheduledOrder,
    SchedulePart,
    StreamedMixtureOrder,
    auto_streams,
    proportional_counts,
    range_counts,
    schedule_parts,
)
from ..order.state import LoaderState, packed_position
from ..sources.dataset import Dataset
from .carry import Carry, carried_parts, carry_from, differences, served_at
from .columns import Form, MixedLayout, common_columns, mixed_forms, shared_read_spec
from .spec import MIXTURE_VERSION, MixtureSpec, epoch_counts, schedule_stages


class Mixture(Dataset):
    """Several datasets read as one: each source's share of an epoch, in one order.

    Made by :func:`mix` or :func:`open_mixture`. ``len(m)`` is the epoch size; ``m.counts``
    each source's samples per epoch; ``m.fingerprint`` changes iff a source's content, a
    count, the batching or the columns change; ``m.lineage`` lists every source's lineage
    and fingerprint; ``m.spec`` is the :class:`MixtureSpec`.
    """

    def __init__(self, spec: MixtureSpec, datasets: list[Dataset]) -> None:
        self.mixture = spec
        self.sources = datasets
        self.converters: list[Any] = []  # Spark side: cached copies of DataFrame sources
        self.stages = schedule_stages(spec)
        self.carry: Carry | None = None  # set on a copy by carry_on (a changed mixture)
        # boundaries in tokens, until a packed loader places them (at_tokens); then the
        # placed copy records the column and the token starts it placed
        self.in_tokens = spec.schedule is not None and spec.schedule[-1].unit == "tokens"
        self.placed: dict[str, Any] | None = None
        self._placed_copies: dict[tuple[Any, ...], Mixture] = {}
        if self.stages is None:
            self.counts = epoch_counts(spec.sources, spec.epoch_size)
        elif self.in_tokens:  # epoch 0 as if the first stage held it (placed: exact)
            self.counts = proportional_counts(self.stages[0][1], int(spec.epoch_size or 0))
        else:
            self.counts = self.epoch_source_counts(0)
        self.path = "mixture(" + ", ".join(s.name or s.path for s in spec.sources) + ")"
        self.shown = self.path
        self.cache_dir = None
        self.allow_unsafe = all(d.allow_unsafe for d in datasets)
        self.source_column = spec.source_column
        self.derived = () if self.source_column is None else (self.source_column,)
        labels = [self._label(i) for i in range(len(datasets))]
        names, plans = common_columns(datasets, spec.columns, labels)
        self._plans = plans
        first = datasets[0].layout
        same = all(d.layout == first for d in datasets) and list(first.names) == names
        encodings = tuple(datasets[0].encoding(n) for n in names)
        self.layout = first if same else MixedLayout(tuple(names), encodings)
        self.shard_base = np.zeros(len(datasets) + 1, dtype=np.int64)
        np.cumsum([d.num_shards for d in datasets], out=self.shard_base[1:])
        self.shard_offsets = np.concatenate(
            [[0], np.cumsum(np.concatenate([np.diff(d.shard_offsets) for d in datasets]))]
        ).astype(np.int64)
        self.sample_base = self.shard_offsets[self.shard_base]
        self.shards = ShardTable(
            np.concatenate([d.shards.samples for d in datasets]),
            np.concatenate([d.shards.raw_bytes for d in datasets]),
            np.concatenate([d.shards.stored_bytes for d in datasets]),
            self._shard_info,
        )
        if self.source_column is not None and self.source_column in names:
            raise MixtureError(
                f"source_column={self.source_column!r} is already a column of the sources"
            )
        self._read_spec = shared_read_spec(datasets, labels)

    # -- what the sources share

    def _label(self, i: int) -> str:
        s = self.mixture.sources[i]
        return s.name or s.path

    def _shard_info(self, shard: int) -> Any:
        s = self._source_of_shard(shard)
        return self.sources[s].shards[shard - int(self.shard_base[s])]

    def _source_of_shard(self, shard: int) -> int:
        return int(np.searchsorted(self.shard_base, shard, side="right") - 1)

    # -- the Dataset interface the order, the reader and the loaders use

    def __len__(self) -> int:
        return int(sum(self.counts))

    @cached_property
    def fingerprint(self) -> str:
        spec = self.mixture
        content = {
            "mixture": MIXTURE_VERSION,
            "sources": [s.fingerprint for s in spec.sources],
            "counts": self.counts,
            "batching": spec.batching,
            "source_column": spec.source_column,
            "columns": list(self.layout.names),
        }
        if self.stages is not None:  # absent without one: unscheduled fingerprints hold
            content["schedule"] = [[start, list(w)] for start, w in self.stages]
        if self.in_tokens:
            content["schedule_unit"] = "tokens"
        if self.placed is not None:
            content["placed"] = self.placed
        if self.carry is not None:
            content["carry"] = self.carry.to_dict()
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    orders_itself = True  # its sources' orders merged (order/mixture_order)

    @property
    def order_uses_batch_size(self) -> bool:  # type: ignore[override]
        return self.mixture.batching != "random"

    @property
    def streams_own_order(self) -> bool:  # type: ignore[override]
        """Its order is drawn from streams of its sources' shards (``order.mixture_streams``),
        unless it carries a run on from another mixture (whose served positions count
        unstreamed sources) or its schedule is in tokens (placed at documents by, and read
        by, a packed loader, whose order is the unstreamed one)."""
        return self.carry is None and self.placed is None and not self.in_tokens

    def auto_streams(self) -> int:
        """The streams ``streams=0`` gives: :func:`~spark_dl_core.order.auto_streams` of the
        sources' shards together and the sum of their mean uncompressed shard bytes (a rank
        reading every stream holds a window per stream of each source, so the byte bound
        counts one shard of each). A function of the sources only, the same on every rank."""
        shards = sum(d.num_shards for d in self.sources)
        raw = [np.asarray(d.shards.raw_bytes, dtype=np.float64) for d in self.sources]
        return auto_streams(shards, float(sum(r.mean() for r in raw if len(r))))

    def make_order(
        self,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int,
        batch_size: int,
        streams: int = 1,
    ) -> MixtureOrder | ScheduledOrder | StreamedMixtureOrder:
        """This epoch's order: with ``streams > 1`` (shuffled) drawn from that many streams
        of every source's shards (``order.mixture_streams``), else the unstreamed merge."""
        self._refuse_tokens()
        plan = MixturePlan(
            fingerprint=self.fingerprint,
            shard_sizes=tuple(np.diff(d.shard_offsets) for d in self.sources),
            bases=tuple(int(b) for b in self.sample_base[:-1]),
            counts=tuple(self.counts),
            source_fingerprints=tuple(str(s.fingerprint) for s in self.mixture.sources),
            batching=self.mixture.batching,
        )
        if shuffle and streams > 1:
            if self.carry is not None:
                raise MixtureError(
                    f"streams={streams}: a mixture carrying a run on from another mixture's "
                    "state reads its sources unstreamed; pass streams=1 (or 0)"
                )
            return StreamedMixtureOrder(
                plan,
                self._natural_parts,
                int(self.mixture.epoch_size or 0) if self.stages is not None else len(self),
                seed,
                epoch,
                shuffle,
                window,
                streams,
                batch_size,
            )
        if self.carry is not None:
            parts = self.epoch_parts(epoch)
            return ScheduledOrder(
                plan,
                [],
                len(self),
                seed,
                epoch,
                shuffle,
                window,
                parts=parts,
                batch_size=batch_size,
            )
        if self.stages is not None:
            size = int(self.mixture.epoch_size or 0)
            return ScheduledOrder(
                plan, self.stages, size, seed, epoch, shuffle, window, batch_size=batch_size
            )
        return MixtureOrder(plan, seed, epoch, shuffle, window, batch_size)

    def at_tokens(
        self, column: str, seed: int, shuffle: bool, verify: bool | None = None
    ) -> Mixture:
        """This mixture with its token boundaries placed at documents (a copy whose stages
        start at sample positions; cached), for a packed loader reading ``column`` with
        ``seed`` and ``shuffle`` (they decide which documents come first). Itself when its
        boundaries are in samples. See :mod:`..sources.token_stages`."""
        if not self.in_tokens:
            return self
        key = (column, int(seed), bool(shuffle))
        found = self._placed_copies.get(key)
        if found is None:
            from ..sources.token_stages import place_token_stages

            starts = place_token_stages(self, column, int(seed), bool(shuffle), verify)
            found = copy.copy(self)
            found.__dict__.pop("fingerprint", None)
            found._placed_copies = {}
            found.in_tokens = False
            found.stages = [(s, w) for s, (_, w) in zip(starts, self.stages or [])]
            found.placed = {
                "column": column,
                "tokens": [int(t) for t, _ in self.stages or []],
                "samples": starts,
            }
            found.counts = found.epoch_source_counts(0)
            self._placed_copies[key] = found
        return found

    def _refuse_tokens(self) -> None:
        if self.in_tokens:
            stages = self.mixture.schedule or []
            stage = stages[1] if len(stages) > 1 else None
            at = f"stage 1 starts at {stage.start} tokens" if stage else "boundaries in tokens"
            raise MixtureError(
                f"schedule {at} (field start): token boundaries are placed at documents by a "
                "loader with pack= (its token column, seed and shuffle decide which documents "
                "come first); without pack= give the boundaries in samples"
            )

    def _natural_parts(self, epoch: int) -> list[SchedulePart]:
        """The epoch's parts of this mixture's own order (one part without a schedule)."""
        self._refuse_tokens()
        if self.stages is not None:
            return schedule_parts(self.stages, int(self.mixture.epoch_size or 0), epoch)
        starts = tuple(epoch * c for c in self.counts)
        return [SchedulePart(0, len(self), 0, tuple(self.counts), starts)]

    def epoch_parts(self, epoch: int) -> list[SchedulePart]:
        """The epoch's parts (where each starts, its stage, per-source counts and stream
        starts), after the carry point too when this mixture carries a run on."""
        if self.carry is None:
            return self._natural_parts(epoch)
        return carried_parts(self._natural_parts, len(self), self.carry, epoch)

    # -- resume: the state a loader saves, and carrying on from another mixture's

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any]:
        """What a loader state records of a position (``LoaderState.source``): the epoch
        size, the stage, each source's served stream position (docs/mixtures.md), and the
        carry this order continues, if any."""
        served, stage = served_at(self.epoch_parts(epoch), consumed)
        record: dict[str, Any] = {
            "total": len(self),
            "stage": stage,
            "sources": [
                {"name": self._label(i), "fingerprint": s.fingerprint, "served": int(q)}
                for i, (s, q) in enumerate(zip(self.mixture.sources, served))
            ],
        }
        if self.carry is not None:
            record["carry"] = self.carry.to_dict()
        return record

    def carried(self, carry: Carry) -> Mixture:
        """This mixture continuing a run from ``carry`` (a copy: its own fingerprint)."""
        out = copy.copy(self)
        out.carry = carry
        out.__dict__.pop("fingerprint", None)
        return out

    @property
    def carry_on(self) -> Callable[[LoaderState, bool], tuple[Mixture, int, int]]:
        """A state saved over another mixture's fingerprint carries on (:meth:`carry_state`)."""
        return self.carry_state

    def carry_state(self, state: LoaderState, strict: bool) -> tuple[Mixture, int, int]:
        """(the mixture to read, epoch, consumed) for a state saved under another mixture's
        fingerprint: this mixture's own carried-on run resumes as it is; with ``strict``
        anything else is refused naming what differs; else the run carries on by the rule
        of docs/mixtures.md, or a :class:`MixtureError` names why it cannot."""
        record = state.source or {}
        if record.get("carry") is not None:
            same = self.carried(Carry.from_dict(record["carry"]))
            if same.fingerprint == state.fingerprint:
                return (same, *state.position(len(same)))
        names = [self._label(i) for i in range(len(self.sources))]
        fingerprints = [s.fingerprint for s in self.mixture.sources]
        if strict:
            raise MixtureError(
                f"loader state is for dataset {state.fingerprint[:16]}…, but {self.path} has "
                f"fingerprint {self.fingerprint[:16]}…: resuming would mix up samples "
                f"({differences(record, names, fingerprints)}); a changed mixture carries "
                "the run on with load_state_dict(state, strict=False)"
            )
        if state.shuffle and state.streams > 1 and state.pack is None:
            raise MixtureError(
                f"loader state was read with streams={state.streams}: its sources' samples "
                "came from streams of their shards, which a changed mixture cannot carry on "
                f"from; resume it over the mixture that saved it ({state.fingerprint[:16]}…), "
                "or carry on only runs read with streams=1"
            )
        return self._carry_from(state, record, names, fingerprints)

    def _carry_from(
        self,
        state: LoaderState,
        record: dict[str, Any],
        names: list[str],
        fingerprints: list[str | None],
    ) -> tuple[Mixture, int, int]:
        if not record.get("sources"):
            raise MixtureError(
                "loader state records no per-source positions (field source): it was saved "
                "over a plain dataset or by an older spark-dl, so a mixture cannot tell which "
                "samples it served"
            )
        if packed_position(state.pack):
            raise MixtureError(
                "loader state is a packed position inside an epoch (field pack): a changed "
                "mixture packs other documents, so a packed run carries on only from an "
                "epoch's start (not supported yet inside one)"
            )
        total = int(record.get("total", 0))
        epoch, consumed = state.position(total)
        if total != len(self) and (self.stages is not None or consumed > len(self)):
            stage = f"stage {record.get('stage', 0)}: " if self.stages is not None else ""
            where = "lies past this epoch" if consumed > len(self) else "means another run position"
            raise MixtureError(
                f"{stage}the state's epoch has {total} samples and this mixture's "
                f"{len(self)} (field epoch_size): its position (epoch {epoch}, consumed "
                f"{consumed}) {where}; keep epoch_size to carry the run on"
            )
        carry = carry_from(record, names, fingerprints, epoch, consumed)
        return self.carried(carry), epoch, consumed

    def epoch_source_counts(self, epoch: int) -> list[int]:
        """Samples each source gives in ``epoch`` (with a schedule, the sum over the
        epoch's parts; without one, ``counts``, the same every epoch)."""
        if self.stages is None and self.carry is None:
            return list(self.counts)
        parts = self.epoch_parts(epoch)
        return [int(sum(p.counts[s] for p in parts)) for s in range(len(self.sources))]

    def epoch_stream_starts(self, epoch: int) -> list[int]:
        """Where each source's stream (its passes back to back) stands at ``epoch``'s start:
        how many of its samples the run delivered before it."""
        if self.stages is None and self.carry is None:
            return [epoch * c for c in self.counts]
        return list(self.epoch_parts(epoch)[0].stream_starts)

    def stage_table(self) -> list[dict[str, Any]]:
        """The schedule stage by stage (empty without one): its start and end (run
        positions; None for the last, open-ended stage), weights by source name and the
        samples each source gives over the whole stage (the last stage: per epoch), by
        the rounding rules of docs/mixtures.md. For cards and ``spark-dl inspect``."""
        if self.stages is None:
            return []
        size = int(self.mixture.epoch_size or 0)
        names = [self._label(i) for i in range(len(self.sources))]
        out: list[dict[str, Any]] = []
        if self.in_tokens:  # not placed yet: no sample counts
            for k, (start, weights) in enumerate(self.stages):
                end = self.stages[k + 1][0] if k + 1 < len(self.stages) else None
                out.append(
                    {
                        "stage": k,
                        "start": int(start),
                        "end": end,
                        "unit": "tokens",
                        "weights": {n: w for n, w in zip(names, weights) if w},
                        "counts": {},
                    }
                )
            return out
        for k, (start, weights) in enumerate(self.stages):
            end = self.stages[k + 1][0] if k + 1 < len(self.stages) else None
            got = (
                proportional_counts(weights, size)
                if end is None
                else range_counts(weights, start, end, size)
            )
            out.append(
                {
                    "stage": k,
                    "start": int(start),
                    "end": end,
                    "weights": {n: w for n, w in zip(names, weights) if w},
                    "counts": {n: int(c) for n, c, w in zip(names, got, weights) if w},
                }
            )
        return out

    @property
    def plans(self) -> list[ColumnPlan] | None:
        return self._plans

    @property
    def spec(self) -> dict[str, Any] | None:
        return self._read_spec

    @property
    def source(self) -> dict[str, Any]:
        return {}

    @property
    def lineage(self) -> list[dict[str, Any]]:
        """Each source: name, path, fingerprint, samples per epoch and its own lineage."""
        return [
            {
                "name": s.name or s.path,
                "path": s.path,
                "fingerprint": s.fingerprint,
                "samples": s.samples,
                "per_epoch": c,
                **({"lineage": s.lineage} if s.lineage else {}),
            }
            for s, c in zip(self.mixture.sources, self.counts)
        ]

    @property
    def columns(self) -> dict[str, str]:
        out = {n: e.name for n, e in zip(self.layout.names, self.layout.encodings)}
        if self.source_column is not None:
            out[self.source_column] = "int64"
        return out

    def encoding(self, column: str) -> Encoding:
        if column == self.source_column:
            return get_encoding("int64")
        return super().encoding(column)

    @cached_property
    def forms(self) -> dict[str, Form]:
        """One form per variable ndarray column across sources (see
        :func:`~.columns.mixed_forms`)."""
        return mixed_forms(self.sources, self.layout.names)

    def derive(self, name: str, index: np.ndarray) -> np.ndarray:
        """The source column: each sample's source index (position in ``sources``)."""
        return np.searchsorted(self.sample_base, index, side="right").astype(np.int64) - 1

    def count_sources(self, ids: np.ndarray) -> np.ndarray:
        """Per source, how many of ``ids`` it gives (``loader.stats()`` counts delivered
        batches with it when asked, never on the batch path)."""
        which = self.derive("", np.asarray(ids, dtype=np.int64))
        return np.bincount(which, minlength=len(self.sources)).astype(np.int64)

    def stage_at(self, epoch: int, consumed: int) -> int | None:
        """The schedule's stage at a position (the next sample's); None without one."""
        if self.stages is None:
            return None
        return served_at(self.epoch_parts(epoch), consumed)[1]

    def source_report(self, counts: np.ndarray, epoch: int, consumed: int) -> dict[str, Any]:
        """Per-source ``counts`` by name, the stage at (epoch, consumed) and where it
        started (run position), for ``loader.stats()``."""
        names = [self._label(i) for i in range(len(self.sources))]
        out: dict[str, Any] = {
            "sources": {
                n if names.count(n) == 1 else f"{n}#{i}": int(c)
                for i, (n, c) in enumerate(zip(names, counts))
            }
        }
        stage = self.stage_at(epoch, consumed)
        if stage is not None and self.stages is not None:
            out["stage"] = stage
            out["stage_start"] = int(self.stages[stage][0])
        return out

    def locate(self, sample: int) -> tuple[str, int]:
        s = int(np.searchsorted(self.sample_base, sample, side="right") - 1)
        return self.sources[s].locate(sample - int(self.sample_base[s]))

    def stored_bytes(self, shard: int) -> np.ndarray:
        s = self._source_of_shard(shard)
        return self.sources[s].stored_bytes(shard - int(self.shard_base[s]))

    def prefetch_shards(self, shards: list[int], threads: int | None = None) -> bool:
        remote = False
        for s, local in self._by_source(shards).items():
            remote = self.sources[s].prefetch_shards(local, threads) or remote
        return remote

    def release_shards(self, shards: list[int]) -> None:
        for s, local in self._by_source(shards).items():
            self.sources[s].release_shards(local)

    def by_store(self) -> list[list[int]]:
        """The sources' indices grouped by the store they read through: MDS sources on one
        store share its node cache and its counters."""
        groups: dict[int, list[int]] = {}
        for i, source in enumerate(self.sources):
            groups.setdefault(id(getattr(source, "store", source)), []).append(i)
        return list(groups.values())

    def download_stats(self) -> dict[str, float] | None:
        total: dict[str, float] | None = None
        for group in self.by_store():
            stats = self.sources[group[0]].download_stats()  # counted once a store
            if stats is not None:
                total = {k: (total or {}).get(k, 0.0) + v for k, v in stats.items()}
        return total

    def _by_source(self, shards: list[int]) -> dict[int, list[int]]:
        """Shards by source, as each source numbers them (in the given order)."""
        out: dict[int, list[int]] = {}
        for shard in shards:
            s = self._source_of_shard(shard)
            out.setdefault(s, []).append(shard - int(self.shard_base[s]))
        return out

    def doc_lengths(self, column: str, shards: Sequence[int]) -> list[np.ndarray] | None:
        """Per shard (numbered over the sources, as :meth:`load_shard` takes them), its
        documents' recorded lengths from its source; None unless every source records them
        (a packed loader then reads the mixture unstreamed)."""
        if any(d.doc_lengths(column, []) is None for d in self.sources):
            return None
        found: dict[int, np.ndarray] = {}
        for s, local in self._by_source([int(x) for x in shards]).items():
            got = self.sources[s].doc_lengths(column, local)
            assert got is not None
            base = int(self.shard_base[s])
            found.update((base + shard, lengths) for shard, lengths in zip(local, got))
        return [found[int(x)] for x in shards]

    def load_shard(
        self,
        shard: int,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> ShardData:
        s = self._source_of_shard(shard)
        return self.sources[s].load_shard(shard - int(self.shard_base[s]), verify_hashes, timings)

    def __repr__(self) -> str:
        parts = ", ".join(f"{self._label(i)}: {c}" for i, c in enumerate(self.counts))
        return (
            f"<Mixture of {len(self.sources)} sources, {len(self)} samples per epoch "
            f"({parts}), batching={self.mixture.batching!r}>"
        )

    def save(self, path: str) -> None:
        """Write the :class:`MixtureSpec` as JSON (reopen with :func:`open_mixture`)."""
        with open(path, "w", encoding="utf-8") as f:
            # no "schedule" key without one: such files stay what earlier versions wrote
            unset = {"schedule"} if self.mixture.schedule is None else None
            f.write(self.mixture.model_dump_json(indent=2, exclude=unset))
