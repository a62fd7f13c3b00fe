"""Storage: local and remote files, the machine's shard cache, and shard indexing."""
