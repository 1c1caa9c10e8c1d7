"""The pretraining study: spec, staging of token shards, the block-wise runner, results and report (docs/RESULTS.md)."""
