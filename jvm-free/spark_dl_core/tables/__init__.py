"""Tables read in place: a table format's snapshot (Delta) over its Parquet data files."""
