"""Mixtures: several datasets read as one, each giving an exact number of samples per epoch.

A mixture is data (:class:`MixtureSpec`: the sources' paths, fingerprints, lineage and
weights, and the settings) and, once opened, a second kind of dataset (:class:`Mixture`)
for the order and the reader: its samples are the sources' samples back to back in one id
space, its shards the sources' shards, and its order (:class:`~spark_dl_core.order.
MixtureOrder`) picks each source's share of an epoch. Every loader (``iter_batches``,
``to_torch``, ``to_tf``) and its resume state works on it unchanged.

Weights follow Mosaic Streaming's ``Stream`` vocabulary (see docs/mixtures.md for every
rule): per source at most one of ``proportion`` (relative, normalized over the sources),
``repeat`` (a multiple of the source's size) or ``choose`` (samples per epoch).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from ..errors import ColumnNotFoundError, MixtureError
from ..format.compact import ShardTable
from ..format.encodings import Encoding, get_encoding
from ..format.shard import Layout, ShardData
from ..meta import ColumnPlan
from ..order import (
    BATCHING,
    MixtureOrder,
    MixturePlan,
    ScheduledOrder,
    SchedulePart,
    proportional_counts,
    range_counts,
    schedule_parts,
)
from ..order.state import LoaderState
from .carry import Carry, carried_parts, carry_from, differences, served_at
from .dataset import Dataset, open_dataset
from .delta import DeltaSnapshot

MIXTURE_VERSION = 1
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmbgt]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(value: int | str, field: str = "epoch_size") -> int:
    """Samples from ``1000000``, ``"1M"``, ``"64k"`` or ``"2.5B"`` (powers of 1000)."""
    if isinstance(value, bool):
        raise MixtureError(f"{field}={value!r}: a number of samples, e.g. 1000000 or '1M'")
    if isinstance(value, (int, np.integer)):
        count = int(value)
    else:
        match = _COUNT.match(str(value))
        if not match:
            raise MixtureError(f"{field}={value!r}: a number of samples, e.g. 1000000 or '1M'")
        exact = Decimal(match.group(1)) * _SCALE[match.group(2).lower()]
        if exact != exact.to_integral_value():  # 2.7 samples: refused, never truncated
            raise MixtureError(f"{field}={value!r}: a whole number of samples, e.g. 3 or '2.5k'")
        count = int(exact)
    if count < 0:
        raise MixtureError(f"{field}={value!r}: must be >= 0")
    return count


_TOKENS = re.compile(r"^(.*?)\s*tokens?\s*$", re.IGNORECASE)


def parse_start(value: Any, field: str) -> tuple[int, Literal["samples", "tokens"]]:
    """A stage start: (count, unit) from ``6000``, ``"27M"`` (samples) or ``"5M tokens"``,
    ``"100B tokens"``, ``"5000000 tokens"`` (tokens of the pack column)."""
    if isinstance(value, str):
        match = _TOKENS.match(value)
        if match:
            if not match.group(1):
                raise MixtureError(f"{field}={value!r}: a number of tokens, e.g. '100B tokens'")
            return parse_count(match.group(1), field), "tokens"
    return parse_count(value, field), "samples"


@dataclass
class Source:
    """One dataset of a mixture and its weight (at most one of the three).

    ``dataset``: a path (any store :func:`~spark_dl_core.open_dataset` opens), an open
    :class:`~spark_dl_core.Dataset` or a pinned Delta snapshot (``open_delta(...)``, read in
    place); on the Spark side (``spark_dl.mix``) also a DataFrame.
    ``proportion``: relative weight. ``repeat``: samples per epoch as a multiple of the
    source's size (fractional up- or down-sampling). ``choose``: samples per epoch.
    ``name`` labels it in errors, stats and cards (default: the path).
    """

    dataset: Any
    proportion: float | None = None
    repeat: float | None = None
    choose: int | str | None = None
    name: str | None = None

    def label(self, index: int) -> str:
        if self.name:
            return self.name
        if isinstance(self.dataset, Dataset):
            return self.dataset.shown
        if isinstance(self.dataset, (str, os.PathLike)):
            return str(self.dataset)
        if isinstance(self.dataset, DeltaSnapshot):
            since = self.dataset.since
            at = f"v{since}..v" if since is not None else "v"  # rows new since a version
            return f"{self.dataset.table_uri}@{at}{self.dataset.version}"
        return f"source {index}"


class SourceSpec(BaseModel):
    """A source as saved in a :class:`MixtureSpec`. ``fingerprint`` and ``samples`` are
    filled in when the mixture is built; a hand-written spec (SQL) may leave them out, and
    then takes the source as it is when opened."""

    model_config = ConfigDict(extra="forbid")

    path: str
    name: str | None = None
    fingerprint: str | None = None
    samples: int | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    lineage: dict[str, Any] = {}


class Stage(BaseModel):
    """One stage of a schedule: from run position ``start`` (samples delivered since the
    start of the run, across epochs) on, the sources named in ``weights`` are mixed in
    proportion to them (sources left out give nothing)."""

    model_config = ConfigDict(extra="forbid")

    start: int
    weights: dict[str, float]
    # "tokens": ``start`` counts real tokens of the pack column delivered since the start of
    # the run (``"100B tokens"``); placed at a document by a loader with pack= (docs)
    unit: Literal["samples", "tokens"] = "samples"

    @model_validator(mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        # a hand-written spec (a SQL view's JSON) writes starts as mix() takes them: "27M",
        # "100B tokens"
        if isinstance(value, dict) and "start" in value:
            count, unit = parse_start(value["start"], "schedule stage start")
            if unit == "tokens" and value.get("unit", "tokens") != "tokens":
                raise ValueError(f"start={value['start']!r} is in tokens, unit={value['unit']!r}")
            value = {**value, "start": count, "unit": value.get("unit", unit)}
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        out = handler(self)
        if isinstance(out, dict) and out.get("unit") == "samples":
            out.pop("unit")  # sample boundaries are written as earlier versions wrote them
        return out


class MixtureSpec(BaseModel):
    """A mixture as data: JSON round trip (``model_dump_json`` / :func:`open_mixture`)."""

    model_config = ConfigDict(extra="forbid")

    version: int = MIXTURE_VERSION
    sources: list[SourceSpec]
    epoch_size: int | None = None
    batching: str = "random"
    source_column: str | None = None
    columns: list[str] | None = None
    schedule: list[Stage] | None = None

    @field_validator("batching")
    @classmethod
    def _known_batching(cls, value: str) -> str:
        if value not in BATCHING:
            raise ValueError(f"must be one of {list(BATCHING)}")
        return value


def epoch_counts(sources: Sequence[SourceSpec], epoch_size: int | None) -> list[int]:
    """Samples each source gives per epoch (the rules of docs/mixtures.md).

    Proportions (every source has one): normalized; ``epoch_size`` defaults to the sources'
    total; each gets ``floor(epoch_size * share)`` and the few samples left go one each to
    the sources with the largest remainders (ties: the earlier source), so the counts sum to
    ``epoch_size`` exactly. Absolute weights: ``repeat`` gives ``round(repeat * samples)``,
    ``choose`` itself, no weight ``repeat=1``; ``epoch_size`` is their sum and may not be
    given.
    """
    relative = [s.proportion is not None for s in sources]
    for i, s in enumerate(sources):
        label = s.name or s.path
        given = [f for f in ("proportion", "repeat", "choose") if getattr(s, f) is not None]
        if len(given) > 1:
            raise MixtureError(f"source {i} ({label}): give one of {given}, not {len(given)}")
        for f in given:
            value = getattr(s, f)
            if not math.isfinite(value) or value < 0:
                raise MixtureError(f"source {i} ({label}): {f}={value!r} must be finite, >= 0")
    if any(relative) and not all(relative):
        i = relative.index(False)
        raise MixtureError(
            f"source {i} ({sources[i].name or sources[i].path}) has no proportion while others "
            "do: relative weights (proportion) and absolute ones (repeat, choose, none) "
            "cannot be mixed; give every source a proportion"
        )
    if all(relative) and sources:
        weights = [float(s.proportion or 0.0) for s in sources]
        if sum(weights) <= 0:
            raise MixtureError(f"proportions {weights} sum to 0: nothing to read")
        size = sum(s.samples or 0 for s in sources) if epoch_size is None else epoch_size
        counts = proportional_counts(weights, size)
    else:
        if epoch_size is not None:
            raise MixtureError(
                f"epoch_size={epoch_size} with repeat/choose weights: the epoch is their sum "
                "(as in Mosaic Streaming); leave epoch_size out or use proportions"
            )
        counts = []
        for s in sources:
            if s.choose is not None:
                counts.append(int(s.choose))
            else:
                counts.append(round((1.0 if s.repeat is None else s.repeat) * (s.samples or 0)))
    for i, (s, c) in enumerate(zip(sources, counts)):
        if c and not s.samples:  # filled in by mix() / open_mixture()
            raise MixtureError(
                f"source {i} ({s.name or s.path}) is empty but its weight asks for {c} samples "
                "per epoch"
            )
    if sum(counts) == 0:
        raise MixtureError("the mixture's epoch has 0 samples: every weight gives nothing")
    return counts


Stages = list[tuple[int, tuple[float, ...]]]


def schedule_stages(spec: MixtureSpec) -> Stages | None:
    """A spec's schedule checked, as (start, per-source weights) per stage; None without one.

    Refused, naming the stage: no ``epoch_size``, a
    first stage not at 0, boundaries not increasing, a source the mixture lacks, a weight
    not positive and finite, a stage that asks an empty source for samples; and a source
    with a weight of its own (the schedule gives every weight).
    """
    if spec.schedule is None:
        return None
    if not spec.schedule:
        raise MixtureError("schedule=[]: give at least one stage, e.g. [(0, {'web': 1.0})]")
    if spec.epoch_size is None:
        raise MixtureError("schedule: needs epoch_size= (stages are counted in samples)")
    names = [s.name or s.path for s in spec.sources]
    for i, s in enumerate(spec.sources):
        if names.count(names[i]) > 1:
            raise MixtureError(
                f"source {i} ({names[i]}): two sources have this name; a "
                "schedule names sources by Source(name=)"
            )
        given = [f for f in ("proportion", "repeat", "choose") if getattr(s, f) is not None]
        if given:
            raise MixtureError(
                f"source {i} ({names[i]}) has {given[0]}= and the mixture has a schedule: "
                "the schedule gives every weight; leave it out of Source()"
            )
    out: Stages = []
    unit = spec.schedule[-1].unit
    for k, stage in enumerate(spec.schedule):
        shown = f"{stage.start} tokens" if stage.unit == "tokens" else stage.start
        where = f"schedule stage {k} (start={shown})"
        if k and stage.unit != unit:
            raise MixtureError(
                f"{where}: boundaries are in {stage.unit}, stage {len(spec.schedule) - 1}'s "
                f"in {unit}: give every boundary in one unit"
            )
        if k == 0 and stage.start != 0:
            raise MixtureError(f"{where}: the first stage must start at 0")
        if k and stage.start <= out[-1][0]:
            raise MixtureError(
                f"{where}: boundaries must increase, stage {k - 1} starts at {out[-1][0]}"
            )
        if not stage.weights:
            raise MixtureError(f"{where}: names no source")
        unknown = [n for n in stage.weights if n not in names]
        if unknown:
            raise MixtureError(f"{where}: source {unknown[0]!r} is not in the mixture ({names})")
        for name, w in stage.weights.items():
            if not math.isfinite(w) or w <= 0:
                raise MixtureError(
                    f"{where}: source {name!r} weight={w!r} must be positive and finite "
                    "(leave a source out of a stage to give it nothing)"
                )
        weights = tuple(float(stage.weights.get(n, 0.0)) for n in names)
        specs = [s.model_copy(update={"proportion": w}) for s, w in zip(spec.sources, weights)]
        try:
            epoch_counts(specs, spec.epoch_size)
        except MixtureError as exc:
            raise MixtureError(f"{where}: {exc}") from None
        out.append((stage.start, weights))
    return out


def _parse_schedule(schedule: Any) -> list[Stage]:
    """``mix(schedule=...)``: (start, {name: weight}) pairs (or dicts, or :class:`Stage`);
    a start may be a count string such as ``"27k"``."""
    if isinstance(schedule, (str, bytes, dict)) or not isinstance(schedule, Sequence):
        raise MixtureError(f"schedule={schedule!r}: a list of (start, {{name: weight}}) stages")
    stages = []
    for k, item in enumerate(schedule):
        if isinstance(item, Stage):
            stages.append(item)
            continue
        if isinstance(item, dict):
            start, weights = item.get("start"), item.get("weights")
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            start, weights = item
        else:
            raise MixtureError(f"schedule stage {k}: {item!r} is not (start, {{name: weight}})")
        at, unit = parse_start(start if start is not None else "", f"schedule stage {k} start")
        if not isinstance(weights, dict):
            raise MixtureError(
                f"schedule stage {k} (start={at}): weights {weights!r} are not "
                "a {name: weight} dict"
            )
        for name, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
                raise MixtureError(
                    f"schedule stage {k} (start={at}): source {name!r} weight={w!r} is not a number"
                )
        stages.append(
            Stage(start=at, weights={str(n): float(w) for n, w in weights.items()}, unit=unit)
        )
    return stages


class _MixedLayout(Layout):
    """The mixture's columns when the sources store them in different layouts: no common
    row size, so readers gather per shard (each shard keeps its own layout)."""

    @property
    def row_size(self) -> int | None:
        return None


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
        self.meta = None
        self._index_text = None
        self._compact = None
        self._verified: set[int] = set()
        self._warned_unverifiable = False
        self.source_column = spec.source_column
        self.derived = () if self.source_column is None else (self.source_column,)
        names, plans = self._common_columns()
        self._plans = plans
        first = datasets[0].layout
        same = all(d.layout == first for d in datasets) and list(first.names) == names
        encodings = tuple(datasets[0].encoding(n) for n in names)
        self.layout = first if same else _MixedLayout(tuple(names), encodings)
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
        reads = [json.dumps(_read_ops(d), sort_keys=True) for d in datasets]
        if any(r != reads[0] for r in reads):
            i = next(i for i, r in enumerate(reads) if r != reads[0])
            raise MixtureError(
                f"source {i} ({self._label(i)}) records other read-time transforms in its spec "
                f"than source 0 ({self._label(0)}): give them as loader transforms instead"
            )
        self._read_spec = {"transforms": json.loads(reads[0])} if reads and reads[0] else None

    # -- what the sources share

    def _label(self, i: int) -> str:
        s = self.mixture.sources[i]
        return s.name or s.path

    def _common_columns(self) -> tuple[list[str], list[ColumnPlan] | None]:
        """The mixture's stored columns (values and their null masks), checked alike in
        every source: same encoding, same Arrow type, same null mask."""
        datasets = self.sources
        wanted = self.mixture.columns
        user = [_user_columns(d) for d in datasets]
        if wanted is None:
            for i, cols in enumerate(user[1:], 1):
                if set(cols) != set(user[0]):
                    only0 = sorted(set(user[0]) - set(cols))
                    only_i = sorted(set(cols) - set(user[0]))
                    common = [c for c in user[0] if c in cols]
                    raise MixtureError(
                        f"sources differ in columns: {self._label(0)} has {only0} that "
                        f"{self._label(i)} lacks, {self._label(i)} has {only_i} that "
                        f"{self._label(0)} lacks; pick the common ones with columns={common}"
                    )
            wanted = user[0]
        for i, cols in enumerate(user):
            missing = [c for c in wanted if c not in cols]
            if missing:
                raise ColumnNotFoundError(
                    f"mixture columns {missing} are not in source {i} ({self._label(i)}), "
                    f"which has {cols}"
                )
        plans: list[ColumnPlan] | None = []
        stored: list[str] = []
        for name in wanted:
            seen = []
            for d in datasets:
                plan = next((p for p in d.plans or [] if p.name == name), None)
                mask = plan.null_mask if plan is not None else None
                arrow = str(plan.arrow_type) if plan is not None else None
                seen.append((d.encoding(name).name, arrow, mask is not None, plan))
            for i in range(1, len(seen)):
                a, b = seen[0], seen[i]
                what = None
                if a[0] != b[0]:
                    what = f"encoding {a[0]!r} in {self._label(0)}, {b[0]!r} in {self._label(i)}"
                elif a[1] is not None and b[1] is not None and a[1] != b[1]:
                    what = f"type {a[1]} in {self._label(0)}, {b[1]} in {self._label(i)}"
                elif a[2] != b[2]:
                    masked = self._label(0) if a[2] else self._label(i)
                    what = f"nulls masked in {masked} only"
                if what:
                    raise MixtureError(f"column {name!r} differs between sources: {what}")
            stored.append(name)
            first = seen[0][3]
            if first is not None and first.null_mask:
                stored.append(first.null_mask)
            if plans is not None:
                if first is not None and all(s[3] is not None for s in seen):
                    plans.append(first)
                else:
                    plans = None
        order = list(datasets[0].layout.names)
        stored.sort(key=lambda n: order.index(n))
        return stored, plans

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

    @property
    def order_uses_batch_size(self) -> bool:
        return self.mixture.batching != "random"

    def make_order(
        self, seed: int, epoch: int, shuffle: bool, window: int, batch_size: int
    ) -> MixtureOrder | ScheduledOrder:
        self._refuse_tokens()
        plan = MixturePlan(
            fingerprint=self.fingerprint,
            shard_sizes=tuple(np.diff(d.shard_offsets) for d in self.sources),
            bases=tuple(int(b) for b in self.sample_base[:-1]),
            counts=tuple(self.counts),
            source_fingerprints=tuple(str(s.fingerprint) for s in self.mixture.sources),
            batching=self.mixture.batching,
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
        boundaries are in samples. See :mod:`.token_stages`."""
        if not self.in_tokens:
            return self
        key = (column, int(seed), bool(shuffle))
        found = self._placed_copies.get(key)
        if found is None:
            from .token_stages import place_token_stages

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

    def carry_on(self, state: LoaderState, strict: bool) -> tuple[Mixture, int, int]:
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
        if state.pack is not None and int(state.pack.get("rows", 0)):
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
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """One form per variable ndarray column across sources: dense when every source
        records the same shape, else jagged when each source's values are 1-D, else
        objects (readers conform each batch to it)."""
        forms: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        for name in self.layout.names:
            seen = {d.forms[name] for d in self.sources if name in d.forms}
            if not seen:
                continue
            if len(seen) == 1:
                forms[name] = seen.pop()
            elif all(kind in ("jagged", "dense") for kind, _ in seen) and all(
                shape is None or len(shape) == 1 for _, shape in seen
            ):
                forms[name] = ("jagged", None)
            elif any(kind == "auto" for kind, _ in seen):
                forms[name] = ("auto", None)
            else:
                forms[name] = ("objects", None)
        return forms

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

    def download_stats(self) -> dict[str, float] | None:
        seen: set[int] = set()
        total: dict[str, float] | None = None
        for source in self.sources:
            stats = source.download_stats()
            if stats is None or id(source.store) in seen:
                continue
            seen.add(id(source.store))
            total = {k: (total or {}).get(k, 0.0) + v for k, v in stats.items()}
        return total

    def _by_source(self, shards: list[int]) -> dict[int, list[int]]:
        """Shards by source, as each source numbers them (in the given order)."""
        out: dict[int, list[int]] = {}
        for shard in shards:
            s = self._source_of_shard(shard)
            out.setdefault(s, []).append(shard - int(self.shard_base[s]))
        return out

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


def _user_columns(dataset: Dataset) -> list[str]:
    """A dataset's columns as users name them (null masks left out)."""
    masks = {p.null_mask for p in dataset.plans or [] if p.null_mask}
    return [n for n in dataset.layout.names if n not in masks]


def _read_ops(dataset: Dataset) -> list[Any]:
    return [t for t in (dataset.spec or {}).get("transforms", []) if t.get("at") == "read"]


def _open_source(
    source: Source, index: int, cache_dir: str | None, storage_options: dict[str, Any] | None
) -> Dataset:
    target = source.dataset
    if isinstance(target, DeltaSnapshot):  # a pinned Delta version, read in place
        return target.dataset()
    if isinstance(target, Dataset):
        if isinstance(target, Mixture):
            raise MixtureError(f"source {index}: a mixture cannot be a source of another")
        return target
    if not isinstance(target, (str, os.PathLike)):
        raise MixtureError(
            f"source {index}: {type(target).__name__} is not a dataset path or an open "
            "Dataset or Delta snapshot (DataFrames: use spark_dl.mix)"
        )
    try:
        return open_dataset(str(target), cache_dir=cache_dir, storage_options=storage_options)
    except MixtureError:
        raise
    except Exception as exc:
        raise MixtureError(f"source {index} ({target}) cannot be opened: {exc}") from exc


def mix(
    sources: Sequence[Source],
    *,
    epoch_size: int | str | None = None,
    batching: str = "random",
    source_column: str | None = None,
    columns: Sequence[str] | None = None,
    schedule: Sequence[Any] | None = None,
    cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Mixture:
    """Read several datasets as one: each source's share of every epoch, exactly.

    See :class:`Source` for weights and docs/mixtures.md for the rules. ``batching``:
    ``"random"`` (sources interleaved by the shuffle), ``"stratified"`` (every batch holds
    each source's share), ``"per_source"`` (each batch from one source). ``source_column``
    adds an int64 column holding each row's source index. ``columns`` picks the columns
    (needed when the sources' columns differ). ``schedule``: ``[(start, {name: weight}),
    ...]``, weights that change at run positions (samples since the start of the run).
    """
    if isinstance(sources, Source) or not isinstance(sources, Sequence) or not sources:
        raise MixtureError("mix() takes a non-empty list of Source(...)")
    for i, s in enumerate(sources):
        if not isinstance(s, Source):
            raise MixtureError(f"source {i}: expected Source(...), got {type(s).__name__}")
    if batching not in BATCHING:
        raise MixtureError(f"batching={batching!r}: must be one of {list(BATCHING)}")
    if columns is not None and (isinstance(columns, str) or not columns):
        raise MixtureError(f"columns={columns!r}: a non-empty list of column names")
    size = None if epoch_size is None else parse_count(epoch_size)
    stages = None if schedule is None else _parse_schedule(schedule)
    datasets = [_open_source(s, i, cache_dir, storage_options) for i, s in enumerate(sources)]
    specs = []
    for i, (s, d) in enumerate(zip(sources, datasets)):
        choose = None if s.choose is None else parse_count(s.choose, f"source {i} choose")
        for field in ("proportion", "repeat"):
            value = getattr(s, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise MixtureError(f"source {i} ({s.label(i)}): {field}={value!r} is not a number")
        specs.append(
            SourceSpec(
                path=d.path,
                name=s.name,
                fingerprint=d.fingerprint,
                samples=int(d.shard_offsets[-1]),
                proportion=s.proportion,
                repeat=s.repeat,
                choose=choose,
                lineage=d.source,
            )
        )
    spec = MixtureSpec(
        sources=specs,
        epoch_size=size,
        batching=batching,
        source_column=source_column,
        columns=None if columns is None else list(columns),
        schedule=stages,
    )
    return Mixture(spec, datasets)


def open_mixture(
    spec: str | os.PathLike[str] | dict[str, Any] | MixtureSpec,
    *,
    follow: bool = False,
    cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Mixture:
    """Reopen a saved mixture (a JSON file, a JSON string, a dict or a MixtureSpec).

    Each source must still have the fingerprint recorded; a source that changed is refused
    (the saved order would no longer be the same samples) unless ``follow=True``, which
    takes the sources as they are now (a new fingerprint) and warns.
    """
    if isinstance(spec, MixtureSpec):
        parsed = spec
    else:
        try:
            if isinstance(spec, dict):
                parsed = MixtureSpec.model_validate(spec)
            else:
                text = str(spec)
                if not text.lstrip().startswith("{"):
                    with open(text, encoding="utf-8") as f:
                        text = f.read()
                parsed = MixtureSpec.model_validate_json(text)
        except OSError as exc:
            raise MixtureError(f"mixture spec {spec!s} cannot be read: {exc}") from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise MixtureError(f"mixture spec is not valid: {problems}") from None
    if parsed.version != MIXTURE_VERSION:
        raise MixtureError(
            f"mixture spec version {parsed.version}; this spark-dl reads {MIXTURE_VERSION}"
        )
    datasets = []
    sources = []
    for i, s in enumerate(parsed.sources):
        d = _open_source(Source(s.path), i, cache_dir, storage_options)
        if s.fingerprint is None:  # a hand-written spec: the source as it is now
            s = s.model_copy(
                update={"fingerprint": d.fingerprint, "samples": int(d.shard_offsets[-1])}
            )
        elif d.fingerprint != s.fingerprint:
            if not follow:
                raise MixtureError(
                    f"source {i} ({s.name or s.path}) changed: fingerprint {d.fingerprint[:16]}…, "
                    f"the mixture recorded {s.fingerprint[:16]}…; open_mixture(..., "
                    "follow=True) takes it as it is now"
                )
            warnings.warn(
                f"mixture source {i} ({s.name or s.path}) changed since the mixture was saved; "
                "following it (new fingerprint, new order)",
                stacklevel=2,
            )
            s = s.model_copy(
                update={"fingerprint": d.fingerprint, "samples": int(d.shard_offsets[-1])}
            )
        datasets.append(d)
        sources.append(s)
    return Mixture(parsed.model_copy(update={"sources": sources}), datasets)
