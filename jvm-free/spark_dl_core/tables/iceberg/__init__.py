"""Apache Iceberg tables read in place (``open_iceberg``), on the Parquet layer."""
