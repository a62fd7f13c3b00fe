"""A mixture as data: its sources and weights, its settings and schedule, and the rules that
turn them into exact per-source counts.

:class:`MixtureSpec` is what a mixture saves and reopens from (JSON); :func:`epoch_counts`
and :func:`schedule_stages` check it and give each source's samples per epoch / per stage.
Weights follow Mosaic Streaming's ``Stream`` vocabulary (see docs/mixtures.md for every
rule): per source at most one of ``proportion`` (relative, normalized over the sources),
``repeat`` (a multiple of the source's size) or ``choose`` (samples per epoch).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator, model_serializer, model_validator

from ..errors import MixtureError
from ..order import BATCHING, proportional_counts
from ..shard_source import TableSnapshot
from ..sources.dataset import Dataset

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
        if isinstance(self.dataset, TableSnapshot):  # a table version read in place
            return str(self.dataset.shown)
        return f"source {index}"


class InPlaceDelta(BaseModel):
    """How a source that is a Delta snapshot read in place is opened again: its ``path``
    (``TABLE@vN``) names no directory. The arguments of ``open_delta`` and the read's spec
    (``snap.dataset(spec)``). A ``filter`` is kept as its text only (a pyarrow expression
    has no faithful JSON form), so such a source is refused when reopened."""

    model_config = ConfigDict(extra="forbid")

    table: str
    version: int
    since: int | None = None
    projection: list[str] | None = None
    filter: str | None = None
    spec: dict[str, Any] = {}


class InPlaceIceberg(BaseModel):
    """How a source that is an Iceberg snapshot read in place is opened again: the table's
    metadata file and the snapshot id (``open_iceberg``'s arguments) and the read's spec; a
    ``filter`` as its text only, so such a source is refused when reopened."""

    model_config = ConfigDict(extra="forbid")

    metadata: str
    snapshot_id: int
    since: int | None = None
    projection: list[str] | None = None
    filter: str | None = None
    spec: dict[str, Any] = {}


class SourceSpec(BaseModel):
    """A source as saved in a :class:`MixtureSpec`. ``fingerprint`` and ``samples`` are
    filled in when the mixture is built; a hand-written spec (SQL) may leave them out, and
    then takes the source as it is when opened. ``delta``: a Delta snapshot read in place
    (else ``path`` is a dataset's)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    name: str | None = None
    fingerprint: str | None = None
    samples: int | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    lineage: dict[str, Any] = {}
    delta: InPlaceDelta | None = None
    iceberg: InPlaceIceberg | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        out = handler(self)
        for kind in ("delta", "iceberg"):
            if isinstance(out, dict) and out.get(kind) is None:
                out.pop(kind, None)  # a dataset source is written as earlier versions wrote it
        return out


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


_STAGE_FORMS = (
    "a stage is a pair (start, {name: weight}) or a dict {'start': start, 'weights': "
    "{name: weight}}, its start a number of samples (0, 27000, '27k') or of tokens "
    "('100B tokens')"
)


def parse_schedule(schedule: Any) -> list[Stage]:
    """``mix(schedule=...)``: (start, {name: weight}) pairs (or dicts, or :class:`Stage`);
    a start may be a count string such as ``"27k"``."""
    if isinstance(schedule, (str, bytes, dict)) or not isinstance(schedule, Sequence):
        raise MixtureError(f"schedule={schedule!r}: a list of (start, {{name: weight}}) stages")
    stages = []
    for k, item in enumerate(schedule):
        if isinstance(item, Stage):
            stages.append(item)
            continue
        if isinstance(item, dict) and {"start", "weights"} <= set(item):
            start, weights = item["start"], item["weights"]
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            start, weights = item
        else:
            raise MixtureError(f"schedule= stage {k}: {item!r} is not a stage; {_STAGE_FORMS}")
        at, unit = parse_start(start, f"schedule stage {k} start")
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
