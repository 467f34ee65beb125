"""Training: planning (plan.py), processes (launch.py), one process's loop (loop.py), loss, schedule, runtime
(devices, precision, process groups), checkpoints, signals and metrics."""
