"""Where outputs live and how they are reached: locations, atomic output, ranged reads, retries, redaction."""
