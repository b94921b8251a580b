"""A front's listening socket and its orderly close (launch.py's server, fronts.py's)."""

from __future__ import annotations

from aiohttp import web

from crucible.server.app import build_app
from crucible.server.state import ServerState
from crucible.server.transport import CrucibleRunner


async def listen(state: ServerState, host: str, port: int, *, reuse_port: bool = False
                 ) -> tuple[web.AppRunner, int]:
    """The app of ``state`` listening on host:port; returns (runner, the bound port).
    ``reuse_port``: share the port with other front processes (server/fronts.py)."""
    # handler_cancellation: a client that disconnects cancels its handler, whose finally
    # aborts the request (a non-streaming request has no write that could fail instead).
    # Connections: headers within --read-timeout (the keep-alive timer), at most
    # --max-connections open (transport.py); bodies are timed by fields.read_body.
    cfg = state.config
    runner = CrucibleRunner(build_app(state), handler_cancellation=True, access_log=None,
                            max_connections=cfg.max_connections, read_timeout=cfg.read_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=min(1024, max(128, cfg.max_connections)),
                       reuse_port=reuse_port or None)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def close_server(state: ServerState, runner: web.AppRunner) -> None:
    """Stop the engine first: live requests end as aborted, so their handlers finish and
    the runner's cleanup does not wait out its timeout behind a long stream."""
    for engine in (state.engine_loop, state.starting):
        if engine is not None:
            await engine.stop()
    await runner.cleanup()
    state.tokenize_pool.shutdown(wait=False, cancel_futures=True)
