"""JAX as the consumer of a wsishard stream: the same DataLoader workers, batches as global ``jax.Array`` s.

``import wsishard.jax`` needs jax (the ``jax`` extra). :func:`loader` wraps the torch
:class:`~wsishard.streaming.loader.ShardLoader` and makes each batch one global array sharded along the batch over
every device of every process; :class:`Collate` normalises and augments it on the devices.
"""

from wsishard.jax.collate import Collate
from wsishard.jax.loader import JaxLoader, default_sharding, loader

__all__ = ["Collate", "JaxLoader", "default_sharding", "loader"]
