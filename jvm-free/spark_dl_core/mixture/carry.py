"""Carrying a run on after its mixture changed: ``loader.load_state_dict(state, strict=False)``.

Every source of a mixture is read as a stream of passes keyed by (its fingerprint, seed)
alone, so stream position ``q`` of a source is the same sample in every mixture that holds
it. A state saved under mixture A records, per source (name, fingerprint), its *served*
stream position: where the epoch part holding the position (the whole epoch without a
schedule) ends in that source's stream, or where it starts when the position lies exactly
on its start (an epoch start, a stage boundary). Everything before it in the stream was
delivered or, for the part cut short, passed over in this pass; nothing after it was.
Mixture B carries on at the same (epoch, consumed): the rest of that epoch is B's parts
cut at the position, and each of B's sources reads its stream from A's served position
(0 for a source A lacked), then on through B's later epochs. A pure function of (B, seed,
the served positions): the same batches at any world size and worker count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import MixtureError
from ..order import SchedulePart, proportional_counts


@dataclass(frozen=True)
class Carry:
    """Where a changed mixture took the run over: the position, and per source of the new
    mixture its stream position there."""

    epoch: int
    consumed: int
    served: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": self.consumed, "served": list(self.served)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Carry:
        try:
            return cls(int(data["epoch"]), int(data["consumed"]), tuple(map(int, data["served"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise MixtureError(f"loader state field source.carry is not valid: {exc}") from None


def _clip(part: SchedulePart, a: int, z: int, starts: Sequence[int]) -> SchedulePart | None:
    """``part`` restricted to epoch offsets ``[a, z)``, its streams starting at ``starts``;
    a part cut short takes its counts scaled to the length left (largest remainders)."""
    lo, hi = max(part.offset, a), min(part.offset + part.length, z)
    if hi <= lo:
        return None
    whole = lo == part.offset and hi == part.offset + part.length
    counts = part.counts if whole else tuple(proportional_counts(part.counts, hi - lo))
    return SchedulePart(lo, hi - lo, part.stage, tuple(counts), tuple(int(s) for s in starts))


def carried_parts(
    natural: Callable[[int], list[SchedulePart]], total: int, carry: Carry, epoch: int
) -> list[SchedulePart]:
    """Epoch ``epoch``'s parts after ``carry``: before the carry point the mixture's own
    (``natural``); from it on, the same parts cut at the point with every source's stream
    continuing from its served position. O(stages)."""
    if epoch < carry.epoch:
        return natural(epoch)
    head: list[SchedulePart] = []
    tail: list[SchedulePart] = []
    at = list(carry.served)
    for part in natural(carry.epoch):
        before = _clip(part, 0, carry.consumed, part.stream_starts)
        if before is not None:
            head.append(before)
        after = _clip(part, carry.consumed, total, at)
        if after is not None:
            tail.append(after)
            at = [x + c for x, c in zip(at, after.counts)]
    if epoch == carry.epoch:
        return head + tail
    own = natural(carry.epoch + 1)[0].stream_starts
    delta = [a - o for a, o in zip(at, own)]
    return [
        replace(p, stream_starts=tuple(s + d for s, d in zip(p.stream_starts, delta)))
        for p in natural(epoch)
    ]


def served_at(parts: Sequence[SchedulePart], consumed: int) -> tuple[tuple[int, ...], int]:
    """(per source the served stream position, the stage) at ``consumed`` of an epoch of
    ``parts``: the end of the part holding it in each stream, or its start when the position
    is the part's first."""
    for part in parts:
        if part.offset <= consumed < part.offset + part.length:
            if consumed == part.offset:
                return part.stream_starts, part.stage
            return tuple(s + c for s, c in zip(part.stream_starts, part.counts)), part.stage
    last = parts[-1]
    return tuple(s + c for s, c in zip(last.stream_starts, last.counts)), last.stage


def differences(old: dict[str, Any], names: list[str], fingerprints: list[str | None]) -> str:
    """The sources a state's record and a mixture do not share, in words."""
    saved = {r.get("name"): r.get("fingerprint") for r in old.get("sources", [])}
    out = [f"source {n!r} added" for n in names if n not in saved]
    out += [f"source {n!r} removed" for n in saved if n not in names]
    out += [
        f"source {n!r} changed (fingerprint)"
        for n, fp in zip(names, fingerprints)
        if n in saved and saved[n] != fp
    ]
    return ", ".join(out) or "weights, schedule or settings differ"


def carry_from(
    record: dict[str, Any],
    names: list[str],
    fingerprints: list[str | None],
    epoch: int,
    consumed: int,
) -> Carry:
    """The carry of a state's ``record`` into a mixture with these sources, at its
    position: each source its served position if the state knows it (same name and
    fingerprint), 0 if the state lacks it; a source named alike whose content changed is
    refused (which of its samples were served is unknown)."""
    saved = {r.get("name"): r for r in record.get("sources", [])}
    served = []
    for i, (name, fp) in enumerate(zip(names, fingerprints)):
        r = saved.get(name)
        if r is None:
            served.append(0)
            continue
        if r.get("fingerprint") != fp:
            raise MixtureError(
                f"source {i} ({name}): its fingerprint {str(fp)[:16]}… differs from the "
                f"state's {str(r.get('fingerprint'))[:16]}… (field fingerprint): which of its "
                "samples were served is unknown; give it another name to start it fresh"
            )
        served.append(int(r["served"]))
    return Carry(epoch, consumed, tuple(served))
