"""Training time: shards streamed into PyTorch with two-level (rank x worker) sharding and a device collate.

world -> partition -> stages (split, read, shuffle) -> decode (batches) -> dataset/loader -> collate
"""
