"""Training loop, schedule, loss, distributed/AMP runtime, checkpoints and averaging."""
