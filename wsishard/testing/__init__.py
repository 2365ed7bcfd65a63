"""Synthetic slides that OpenSlide reads as real ones, and the offline demo."""
