"""The rows of a Delta snapshot that were not live at an earlier version (``since=``).

``open_delta(uri, version=N, since=M)`` keeps the data files of version ``N`` whose rows
were not live at ``M``, found from the log's add/remove actions, commit by commit: a file
live at ``M`` holds old rows; a file added by a commit that changes data (an append, an
overwrite, an UPDATE or MERGE rewrite) holds new rows; a file added by a commit that only
moves rows (``dataChange: false``: OPTIMIZE, Z-order, purge; or a DELETE, which rewrites
the rows it keeps) holds the rows of the files that commit removed, so it is old when they
were all old, new when they were all new, and cannot be told apart when they were both: then
:class:`SinceError` names the commit. A file re-added under its own path (a deletion vector
added by a DELETE) keeps its label. Version ``N``'s deletion vectors still apply to the
files kept. Where the change data feed is on, a copy-on-write UPDATE or MERGE is answered
row by row from its change files (:mod:`.since_changes`): only its inserted and updated rows
are new, not the rows it copied. See docs/delta.md ("New rows since a version").
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from .log import DeltaSnapshotError, file_key, first_line, log_location, log_uri
from .since_changes import FEED as FEED_NAME
from .since_changes import ChangeFeed, combine

if TYPE_CHECKING:  # pragma: no cover
    from .snapshot import DeltaSnapshot

OLD, NEW, MIXED, PARTIAL = "old", "new", "mixed", "partial"  # partial: a mask says which
# Commits that never add a row that was not live before, even when they mark dataChange.
_ROW_KEEPING_OPERATIONS = frozenset({"DELETE"})


class SinceError(DeltaSnapshotError):
    """``since=`` cannot be answered: after ``version``, no longer in the log, or a commit
    between them mixed old and new rows in one file (names table, versions, commit)."""


def new_since(snapshot: DeltaSnapshot, asked_since: Any, deltalake: Any) -> DeltaSnapshot:
    """``snapshot`` restricted to the data files whose rows were not live at ``since``."""
    since = _check_range(snapshot, asked_since)
    asked = f"version {snapshot.version} since {since}"
    base = snapshot.table_uri.rstrip("/")
    live, configuration = _live_at(snapshot, since, deltalake, asked)
    labels = {k: (OLD, since) for k in live}

    def error(message: str) -> SinceError:
        return SinceError(snapshot.table_uri, message, asked=asked, available=snapshot.available)

    feed = ChangeFeed(snapshot, since, configuration, error)
    for version in range(since + 1, snapshot.version + 1):
        actions = _commit_actions(snapshot, version, asked)
        feed.commit(actions)
        _apply_commit(labels, actions, base, version, feed)
    kept, keep = [], {}
    for uri in snapshot.files:
        key = file_key(uri)
        label = _label(snapshot, labels, uri, since)
        if label == NEW and feed.on and labels[key][1] in feed.off_rewrites:
            raise error(
                f"commit {labels[key][1]} (a copy-on-write UPDATE or MERGE) rewrote data file "
                f"{uri} while the change data feed ({FEED_NAME}) was off, so the rows it copied "
                "cannot be told from the rows it changed; the feed is on at version "
                f"{snapshot.version}: pass since >= {labels[key][1]}, or read the whole version"
            )
        if label == PARTIAL:
            mask = combine(feed.masks[key], snapshot._keep.get(key))
            if any(mask):
                kept.append(uri)
                keep[key] = mask
        elif label == NEW:
            kept.append(uri)
            if key in snapshot._keep:
                keep[key] = snapshot._keep[key]
    return dataclasses.replace(snapshot, files=kept, since=since, _keep=keep, _inplace=None)


def _check_range(snapshot: DeltaSnapshot, asked_since: Any) -> int:
    """``since`` as a version number between the log's first and ``snapshot.version``."""
    since = asked_since
    if isinstance(since, str) and since.strip().isdigit():
        since = int(since)
    asked = f"version {snapshot.version} since {since}"
    if isinstance(since, bool) or not isinstance(since, int) or since < 0:
        raise SinceError(
            snapshot.table_uri,
            f"since={asked_since!r} is not a version (a whole number >= 0)",
            asked=f"version {snapshot.version}",
        )
    if since > snapshot.version:
        raise SinceError(
            snapshot.table_uri,
            f"since={since} is after version={snapshot.version}: give since <= version",
            asked=asked,
            available=snapshot.available,
        )
    first = snapshot.available[0] if snapshot.available else 0
    if since < first:
        raise SinceError(
            snapshot.table_uri,
            f"the log no longer holds version {since} (log cleanup / checkpoint), so the "
            "rows live then cannot be known",
            asked=asked,
            available=snapshot.available,
        )
    return since


def _live_at(
    snapshot: DeltaSnapshot, since: int, deltalake: Any, asked: str
) -> tuple[set[str], dict[str, Any]]:
    """The data files live at ``since``, as :func:`file_key` keys, and the table's
    configuration then."""
    import pyarrow as pa

    try:
        table = deltalake.DeltaTable(
            snapshot.table_uri, version=since, storage_options=snapshot.storage_options
        )
        paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        configuration = dict(table.metadata().configuration)
    except Exception as exc:
        raise SinceError(
            snapshot.table_uri,
            f"version {since} cannot be loaded: {first_line(exc)}",
            asked=asked,
            available=snapshot.available,
        ) from None
    base = snapshot.table_uri.rstrip("/")
    return {file_key(log_location(log_uri(base, p))) for p in paths}, configuration


def _commit_actions(snapshot: DeltaSnapshot, version: int, asked: str) -> list[dict[str, Any]]:
    """The actions of commit ``version`` (its ``_delta_log`` JSON file)."""
    filesystem, prefix = snapshot._filesystem()
    uri = f"{snapshot.table_uri.rstrip('/')}/_delta_log/{version:020}.json"
    try:
        with filesystem.open_input_stream(snapshot._fs_path(uri, prefix)) as stream:
            text = stream.read().decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise SinceError(
            snapshot.table_uri,
            f"commit {version} cannot be read from the log ({first_line(exc)})",
            asked=asked,
            available=snapshot.available,
        ) from None


def _apply_commit(
    labels: dict[str, tuple[str, int]],
    actions: list[dict[str, Any]],
    base: str,
    version: int,
    feed: ChangeFeed | None = None,
) -> None:
    """Update ``labels`` (file key -> (old/new/mixed, version that decided it)) by one commit."""
    info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    keeps_rows = str(info.get("operation", "")).upper() in _ROW_KEEPING_OPERATIONS
    removed = [_key(a["remove"], base) for a in actions if "remove" in a]
    added = [(a["add"], _key(a["add"], base)) for a in actions if "add" in a]
    before = dict(labels)
    for key in removed:
        labels.pop(key, None)
    moved = {before[k][0] for k in removed if k in before}
    # rows moved from the removed files: one label when they agree (none removed: unknown)
    origin = next(iter(moved)) if len(moved) == 1 and moved != {PARTIAL} else MIXED
    fresh = [(add, key) for add, key in added if key not in before]
    readded = {key for _, key in added}
    rewritten = {
        _key(a["remove"], base): (a["remove"], before[_key(a["remove"], base)][0])
        for a in actions
        if "remove" in a and _key(a["remove"], base) in before
    }
    rewritten = {k: v for k, v in rewritten.items() if k not in readded}
    by_feed = None
    has_changes = any("cdc" in a for a in actions)
    if feed is not None and rewritten and fresh and (has_changes or PARTIAL in moved):
        # a rewrite the change data feed or row masks may answer row by row
        moves_only = keeps_rows or all(a.get("dataChange", True) is False for a, _ in fresh)
        by_feed = feed.rewrite(actions, version, fresh, rewritten, moves_only)
    elif feed is not None and rewritten and fresh and not keeps_rows:
        feed.rewrite(actions, version, fresh, rewritten, False)  # notes a feed-off rewrite
    for add, key in added:
        if key in before:  # the same file again (a deletion vector added): same rows
            labels[key] = before[key]
        elif by_feed is not None:
            labels[key] = (by_feed[key], version)
        elif add.get("dataChange", True) is not False and not keeps_rows:
            labels[key] = (NEW, version)
        else:
            labels[key] = (origin, version)


def _key(action: dict[str, Any], base: str) -> str:
    return file_key(log_location(log_uri(base, str(action["path"]))))


def _label(
    snapshot: DeltaSnapshot, labels: dict[str, tuple[str, int]], uri: str, since: int
) -> str:
    """Whether ``uri``'s rows are new; a file whose rows cannot be placed is an error."""
    asked = f"version {snapshot.version} since {since}"
    found = labels.get(file_key(uri))
    if found is None:
        raise SinceError(
            snapshot.table_uri,
            f"data file {uri} is live at version {snapshot.version} but neither live at "
            f"{since} nor added by a commit after it (a log this reader cannot follow)",
            asked=asked,
            available=snapshot.available,
        )
    label, version = found
    if label == MIXED:
        raise SinceError(
            snapshot.table_uri,
            f"commit {version} moved rows into data file {uri} (a compaction, or a DELETE, "
            f"UPDATE or MERGE rewrite) from files live at version {since} together with files "
            f"added after it (or from none it names), so its new rows cannot be told apart: pass "
            f"since >= {version}, or read the whole version",
            asked=asked,
            available=snapshot.available,
        )
    return label
