"""The build: slides in, mixed tissue-patch shards and a manifest out, one subpackage per stage a slide goes through.

    options/ -> inputs/ -> scan/ -> plan/ -> extract/ -> shards + manifest    (qc/ beside scan; run/ drives them)

:func:`wsishard.builder.run.orchestrate.build` orchestrates; the other modules are its stages. Nothing here imports
torch or webdataset.
"""
