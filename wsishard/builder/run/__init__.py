"""Run: the build's orchestration, worker pool, output lock, resume state, records and the merge of a cluster
build's parts."""
