"""The MDS byte format: encodings, compression, hashes, shard layout and index files.

This package knows bytes and nothing else: no Spark, no loaders, no storage policy.
"""
