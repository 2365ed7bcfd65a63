"""Training time: shards streamed into PyTorch with two-level (rank x worker) sharding and a device collate.

world -> planner (pieces per reader) -> reader (read, shuffle) -> decode (batches) -> dataset/loader -> collate
"""
