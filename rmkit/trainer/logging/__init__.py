"""What a run shows and keeps of its numbers: `run_logger` (metrics.jsonl, samples.jsonl, TensorBoard, the
announcement), `trackers` (W&B, MLflow), `progress` (the bar and the throughput window), `plots` (the figures
at the end)."""
