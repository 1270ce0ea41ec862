"""FSDP2 LLaMA training that keeps GPUs productive through failures."""
