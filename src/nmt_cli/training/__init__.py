"""Training: planning (plan.py), processes (launch.py), one process's trainer (loop.py) over its data reader
(reader.py), validation (validate.py) and checkpoints (checkpoint_manager.py); loss, schedule, runtime (devices, precision,
process groups), signals and metrics."""
