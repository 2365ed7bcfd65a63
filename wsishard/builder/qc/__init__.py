"""QC: the pictures of what a build saw and kept, recorded by its scan and drawn at any time."""
