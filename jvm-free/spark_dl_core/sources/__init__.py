"""Sources of shards: an MDS dataset, a mixture of sources, a Delta snapshot."""
