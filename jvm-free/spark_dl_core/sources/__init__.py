"""The shared base of every source of shards: the MDS dataset (open, decode, random access,
shard loading) and what kinds built on it share (row carry, token stages)."""
