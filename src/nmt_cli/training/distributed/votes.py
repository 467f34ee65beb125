"""`Votes`: the stop, save and validate flags raised by any rank, agreed by every rank a step later."""

from __future__ import annotations

import torch
import torch.distributed as dist

from nmt_cli.training.distributed.process import Runtime


class Votes:
    """Flags that every rank must act on together (stop, save), agreed a step late: the flags a rank raises at one
    update are summed over the ranks (the default process group: NCCL on GPUs, gloo on CPU) while the next update
    computes, and every rank reads the sums after that update. On a GPU the sum comes back in page-locked memory
    behind an event, so reading it waits only for the exchange, never for the update queued after it, and the host
    keeps feeding the device. One process agrees with itself at once."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self._pending = None  # (work, result tensor on the host, event or None)

    def exchange(self, *flags: bool) -> tuple[bool, ...]:
        """Raise `flags` for this update; -> the flags agreed at the previous one (any rank's raised flag counts):
        all False at the first update. Every rank calls it once per update, in the same order."""
        if not self.rt.distributed:
            return tuple(bool(f) for f in flags)
        agreed = self._read() or (False,) * len(flags)
        cuda = self.rt.device.type == "cuda"
        votes = torch.tensor([float(f) for f in flags], pin_memory=cuda).to(self.rt.device, non_blocking=True)
        work = dist.all_reduce(votes, op=dist.ReduceOp.SUM, async_op=True)
        event = None
        if cuda:
            work.wait()  # (the current stream waits for NCCL's; the host does not)
            votes = votes.to("cpu", non_blocking=True)  # (into page-locked memory)
            event = torch.cuda.Event()
            event.record()
        self._pending = (work, votes, event)
        return agreed

    def drain(self) -> None:
        """Wait for the last exchange (before the ranks leave the loop)."""
        self._read()

    def _read(self) -> tuple[bool, ...] | None:
        if self._pending is None:
            return None
        work, votes, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        else:
            work.wait()
        return tuple(v > 0 for v in votes.tolist())
