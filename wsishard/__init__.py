"""wsishard: whole-slide images to mixed tissue-patch WebDataset shards, streamed into PyTorch."""

__version__ = "0.1.0"
