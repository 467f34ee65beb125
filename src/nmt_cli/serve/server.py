"""Run the service under uvicorn on one host and port until SIGTERM or SIGINT.

A graceful stop: the listening socket closes (no new connections), the requests in flight finish (up to the
request time limit), the engines finish what they accepted, and the process exits 0 (130 after SIGINT, as every
nmt command interrupted). uvicorn itself would re-raise the signal after its graceful shutdown, so the process
would die of it; `_Server` keeps the graceful part and leaves the exit status to us.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import uvicorn

from nmt_cli.serve.app import build_app
from nmt_cli.serve.service import Service

HANDLED = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    signals: list[int]

    @contextlib.contextmanager
    def capture_signals(self):
        self.signals = []
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(sig, frame):
            self.signals.append(sig)
            self.handle_exit(sig, frame)

        original = {sig: signal.signal(sig, handle) for sig in HANDLED}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"nmt serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)


def run(service: Service, host: str, port: int, access_log: bool = False) -> int:
    """Serve until stopped -> the exit status (0, or 130 after SIGINT)."""

    def shutdown() -> None:
        for model in service.models.values():
            model.engine.close(wait=True)

    app = build_app(service, on_shutdown=shutdown)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=access_log,
                            timeout_graceful_shutdown=int(service.limits.timeout) + 5,
                            limit_concurrency=max(64, 2 * service.limits.queue_size), server_header=False)
    server = _Server(config)
    server.run()
    if not server.started:
        return 1
    return 130 if signal.SIGINT in server.signals else 0
