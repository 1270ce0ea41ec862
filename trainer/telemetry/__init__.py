"""What a run shows while it trains, from one set of figures computed once.

The step loop's window gives the step figures (`trainer.telemetry.metrics.StepFigures`); rank 0's
live pass over the event log (`live.LiveRun`, the same `Goodput` pass as results.json) gives
the run's: restarts, each failure's recovery, the newest durable checkpoint, goodput so far.
`report.Telemetry` hands both to every sink: the rank-0 log line, TensorBoard
(`tensorboard.TensorBoardRun`), W&B (`wandb_run.WandbRun`, optional) and the node's figures
file (`published`), which the launcher serves to Prometheus (`exporter`). `status` renders the
same pass as the `watch` view.
"""
