"""The change data feed answering ``since=`` where the file diff alone is coarse.

A copy-on-write ``UPDATE`` or ``MERGE`` (no deletion vectors) removes whole data files and
adds new ones holding the changed rows *and* the unchanged rows it copied: from add and
remove actions alone every row of the new files counts as new (:mod:`.since`). Where the
change data feed is on (``delta.enableChangeDataFeed``), such a commit also writes
``cdc`` actions: ``_change_data`` files holding exactly its ``insert`` and
``update_postimage`` rows (and the deletes and pre-images). Those rows, and no others, are
new; the rest of the new files were live before (an update is a delete plus an insert).

So for each such commit whose removed files were all old at ``since`` (the copied rows are
then old), the rows of its new files are matched, by value and partition, against its
change files' new rows: a mask per file, applied with version ``N``'s deletion vectors. The
change files' ``_change_type`` column is read first: when the new files hold exactly as
many rows as the feed's new rows (nothing copied) no data file is read. A commit whose
removed files were all new leaves its new files new; removed files of both kinds leave
them "mixed" (:class:`~.since.SinceError` if still live at ``N``).

A copy-on-write ``UPDATE``/``MERGE`` committed while the feed was off, on a table whose feed
is on at ``N``, is refused (:func:`refuse_coarse`) rather than answered coarsely: the user
who turned the feed on asked for exact changes. Tables without the feed keep the coarse
answer docs/delta.md describes.

Rows of equal values (and partition) are interchangeable here: a copied row equal to an
updated one may be the one kept as new. The data read is the same.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from .log import first_line, log_location, log_uri

if TYPE_CHECKING:  # pragma: no cover
    from .snapshot import DeltaSnapshot

FEED = "delta.enableChangeDataFeed"
NEW_CHANGES = ("insert", "update_postimage")
REWRITING_OPERATIONS = frozenset({"UPDATE", "MERGE"})


class ChangeFeed:
    """What ``since=`` reads of the change data feed between ``since`` and the snapshot's
    version: the feed's setting commit by commit, each rewrite's row masks, and the commits
    answered coarsely because the feed was off."""

    def __init__(
        self, snapshot: DeltaSnapshot, since: int, configuration: dict[str, Any], error: Any
    ) -> None:
        self.snapshot = snapshot
        self.since = since
        self.on = _on(configuration)
        self.error = error  # (message) -> SinceError naming table and versions
        self.masks: dict[str, list[bool]] = {}  # file key -> which of its rows are new
        self.off_rewrites: set[int] = set()  # copy-on-write UPDATE/MERGE, feed off
        self.base = snapshot.table_uri.rstrip("/")

    def commit(self, actions: list[dict[str, Any]]) -> None:
        """Follow the feed's setting through commit ``actions`` (its metaData action)."""
        for action in actions:
            meta = action.get("metaData")
            if isinstance(meta, dict):
                self.on = _on(meta.get("configuration") or {})

    def rewrite(
        self,
        actions: list[dict[str, Any]],
        version: int,
        added: list[tuple[dict[str, Any], str]],
        removed: dict[str, tuple[dict[str, Any], str]],
        moves_only: bool,
    ) -> dict[str, str] | None:
        """Labels of the files rewrite ``version`` added (``added``: (add action, key),
        none of them live before) from the files it removed (``removed``: key -> (remove
        action, its label)): ``{key: "new"|"old"|"partial"|"mixed"}`` (partial:
        :attr:`masks` says which rows), or None where nothing is known beyond the actions
        (a data-changing commit without change files: every row new)."""
        changes = [a["cdc"] for a in actions if isinstance(a.get("cdc"), dict)]
        if not changes and not moves_only:
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            operation = str(info.get("operation", "")).upper()
            if not self.on and operation in REWRITING_OPERATIONS:
                self.off_rewrites.add(version)
            return None
        kinds = [(c, self._column(c["path"], "_change_type", version)) for c in changes]
        fresh = sum(sum(k in NEW_CHANGES for k in types) for _, types in kinds)
        rows = {key: self._row_count(add, version) for add, key in added}
        copied = sum(rows.values()) - fresh
        if copied < 0:
            raise self.error(
                f"commit {version}'s change data feed holds {fresh} new rows but its "
                f"{len(added)} new data file(s) only {sum(rows.values())}: the feed and the "
                "data files disagree"
            )
        origin = {label for _, label in removed.values()}
        if copied == 0 or origin == {"new"}:
            return {key: "new" for _, key in added}
        if origin == {"old"} and fresh == 0:
            return {key: "old" for _, key in added}
        if "mixed" in origin or any(
            label != "old" and action.get("deletionVector") for action, label in removed.values()
        ):
            return {key: "mixed" for _, key in added}
        wanted: Counter[str] = Counter()  # the commit's own new rows
        for change, types in kinds:
            keys = self._row_keys(change, version)
            wanted.update(k for k, t in zip(keys, types) if t in NEW_CHANGES)
        moved: Counter[str] = Counter()  # new rows the removed files held, copied along
        for key, (action, label) in sorted(removed.items()):
            if label != "old":
                keys = self._row_keys(action, version)
                mask = self.masks.get(key) if label == "partial" else None
                moved.update(k for i, k in enumerate(keys) if mask is None or mask[i])
        labels = {}
        for add, key in sorted(added, key=lambda a: a[1]):
            mask = []
            for row in self._row_keys(add, version):
                source = wanted if wanted[row] > 0 else moved
                mask.append(source[row] > 0)
                source[row] -= 1 if source[row] > 0 else 0
            self.masks[key] = mask
            labels[key] = "new" if all(mask) else "partial" if any(mask) else "old"
        if +wanted:
            raise self.error(
                f"{sum((+wanted).values())} new row(s) of commit {version}'s change data "
                "feed are in none of the data files it added: the feed and the data files "
                "disagree"
            )
        return labels

    # -- reading the commit's files

    def _uri(self, path: str) -> str:
        return log_location(log_uri(self.base, path))

    def _parquet(self, path: str, version: int) -> Any:
        import pyarrow.parquet as pq

        snap = self.snapshot
        filesystem, prefix = snap._filesystem()
        uri = self._uri(path)
        try:
            return uri, pq.ParquetFile(
                snap._fs_path(uri, prefix),
                filesystem=filesystem,
                coerce_int96_timestamp_unit="us",
            )
        except Exception as exc:
            raise self.error(
                f"file {uri} of commit {version} cannot be read for the change data feed "
                f"({first_line(exc)}); a VACUUM may have removed it"
            ) from None

    def _column(self, path: str, name: str, version: int) -> list[Any]:
        uri, pf = self._parquet(path, version)
        if name not in pf.schema_arrow.names:
            raise self.error(f"change data file {uri} of commit {version} has no {name} column")
        return list(pf.read(columns=[name]).column(0).to_pylist())

    def _row_count(self, add: dict[str, Any], version: int) -> int:
        try:
            return int(json.loads(add.get("stats") or "{}")["numRecords"])
        except (KeyError, TypeError, ValueError):
            return int(self._parquet(str(add["path"]), version)[1].metadata.num_rows)

    def _row_keys(self, action: dict[str, Any], version: int) -> list[str]:
        """Each row of the action's file as comparable text: its partition values (as the
        log writes them) and its data columns under their logical names."""
        snap = self.snapshot
        uri, pf = self._parquet(str(action["path"]), version)
        stored = [n for n in snap.schema.names if n not in snap.partition_columns]
        columns = snap.file_columns(pf.schema_arrow, stored, uri)
        table = columns.logical(pf.read(columns=columns.read))
        part = json.dumps(action.get("partitionValues") or {}, sort_keys=True)
        names = sorted(table.column_names)
        values = [table.column(n).to_pylist() for n in names]
        return [repr((part, names, row)) for row in zip(*values)]


def _on(configuration: dict[str, Any]) -> bool:
    return str(configuration.get(FEED, "")).lower() == "true"


def combine(mask: list[bool], keep: list[bool] | None) -> list[bool]:
    """A new-row mask and version N's deletion-vector keep mask (rows past its end kept)."""
    if keep is None:
        return mask
    return [m and (keep[i] if i < len(keep) else True) for i, m in enumerate(mask)]
