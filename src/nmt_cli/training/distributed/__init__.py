"""A training run's processes, each idea in a module of its own (the trainer, loop.py, uses them; they know nothing
of it):

    world.py          which processes and devices a run has (`plan_launch`, `Launch`, `torchrun_env`)
    spawn.py          ranks 1..N-1 that nmt starts itself, before torch is imported, and the watch over them
    process_group.py  one process set up and down: device, threads, the process group, torchrun's restart rounds
    process.py        `Runtime`: one process's rank, device, precision and collectives
    votes.py          stop/save/validate flags agreed by every rank a step later
    ddp.py            DistributedDataParallel around the model
    watchdog.py       a rank that stops answering ends the run with one line naming it
    signals.py        SIGINT/SIGTERM: save, then stop
"""
