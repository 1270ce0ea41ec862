"""Export: a trained model out of the per-rank shard format (`python -m trainer.export`)."""
