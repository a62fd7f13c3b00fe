"""Parquet data files read in place: footers, the row-group plan, filters, the converted
row-group cache and remote spans. Knows no table format: a format's snapshot hands it files."""
