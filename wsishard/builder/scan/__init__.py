"""Scan: per slide, open, resolve mpp, pick the level, find tissue and artefacts, lay out the patch grid,
fit the stain."""
