"""Extract: read a block once, resample it, cut, score and encode its patches (and their context), write the shards."""
