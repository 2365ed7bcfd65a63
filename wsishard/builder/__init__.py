"""The build: slides in, mixed tissue-patch shards and a manifest out.

    inputs -> scan (tissue, grid, qc) -> plan -> extract (patches, staging) -> shards + manifest (run)

:func:`wsishard.builder.run.build` orchestrates; the other modules are its stages. Nothing here imports torch
or webdataset.
"""
