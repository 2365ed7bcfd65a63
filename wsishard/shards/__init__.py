"""The one place that knows tar records: writing shards, reading their members back, verifying them."""
