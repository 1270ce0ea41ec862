"""The training loop and what it trains: model presets, FSDP2 parallelism, data, step figures."""
