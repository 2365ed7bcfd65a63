"""Synthetic slides that OpenSlide reads as real ones (the offline demo, ``wsishard demo``, is :mod:`wsishard.demo`)."""
