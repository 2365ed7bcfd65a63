"""Plan: pure and seeded, slides into groups, blocks into shards; which part of a cluster build this process is."""
