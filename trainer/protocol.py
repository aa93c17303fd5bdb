"""What the trainer writes into its run folder for other parts to read: the rollout records' file names.

`trainer.records` writes `<output_dir>/rollouts/` as JSONL shards (`shard-000001.jsonl`, ...) and one
`index.jsonl`; the studio reads them.
"""

SHARD_PREFIX = "shard-"
INDEX_NAME = "index.jsonl"
