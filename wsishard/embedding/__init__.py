"""Embeddings beside pixels: ``wsishard embed`` runs a user's model over every patch of a build and writes one
sample per slide (its patches' features and coordinates) as a build output of its own; ``wsishard export`` writes
them as one h5 file per slide. This package needs torch; its flags (:mod:`wsishard.embedding.flags`) do not."""
