"""Inputs: the slides a build reads (folders, lists, object-storage prefixes), their tables, copies, regions,
staged copies."""
