"""Delta Lake: the log, a pinned snapshot, deletion vectors, column mapping, ``since``,
following a table, and runs carried on across versions."""
