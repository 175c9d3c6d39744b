"""The sampling pipeline (`pipeline=sample`): sampler → orm / prm → filter → parquet shards.

    data rows ─▶ sampler (rollout backend, n per prompt) ─▶ reward (rule rewards)  ─┐
                                                         ├▶ orm (outcome RM)       ├▶ sample_score ─▶ filter ─▶ shard_k.parquet
                                                         └▶ prm (per-step RM)     ─┘

The DAG (conf/dags/sample.yaml) runs once per shard of prompts; the driver (runner.py) filters
the scored responses and writes each shard atomically. There is no training node.
"""
