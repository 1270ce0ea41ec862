"""The durable tier: per-rank shards staged through pinned host buffers, written and verified on
shared storage, and the directory's lease."""
