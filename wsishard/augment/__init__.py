"""Augmentations of whole batches on the training device, which :class:`~wsishard.streaming.collate.GpuCollate`
and :class:`~wsishard.jax.Collate` apply: stain normalisation and jitter (:mod:`~wsishard.augment.stain`, one C pass on
a CPU: :mod:`~wsishard.augment.stain_cpu`; the recorded stains it checks: :mod:`~wsishard.augment.stainrecords`) and
DINOv2-style multi-crop views (:mod:`~wsishard.augment.multicrop`). Torch only: no I/O, no webdataset.
"""
