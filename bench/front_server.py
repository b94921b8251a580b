"""The front of the front-capacity bench, as a process of its own (front_capacity.py
starts it): ``llm-engine serve``'s front (access log at info, the engine in a process of
its own) with the fake engine of front_core_stub.py behind it.

    python3 bench/front_server.py --port P --spec JSON [--max-queue N] [--profile DIR]

``--profile DIR``: cProfile sees only the thread that enables it, and the front's work is
split between the event loop's thread and the engine link's reader thread (core_link.py),
so each gets a profile of its own, ``DIR/front-loop.prof`` and ``DIR/front-reader.prof``
(``python3 -m pstats``). cProfile's cost per call about doubles a loop of many small calls,
so read shares and call counts rather than absolute times; ``perf record -g -p PID`` on
this process shows the interpreter / C extension / kernel split without that distortion.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import signal
from pathlib import Path
from typing import Coroutine

import crucible
from crucible.engine.settings import Settings
from crucible.server.core_link import CoreLink
from crucible.server.engine_client import EngineProcessConfig
from crucible.server.launch import start_server, stop_server
from crucible.server.state import ServerConfig, ServerState


async def serve(port: int, spec: str, max_queue: int) -> None:
    state = ServerState(ServerConfig(model_name="front-bench", max_queue=max_queue))
    source = EngineProcessConfig(spec, Settings(max_queue=max_queue),
                                 factory="front_core_stub:fake_engine")
    runner, _, load = await start_server(state, "127.0.0.1", port, source)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await load
    await stop.wait()
    await stop_server(state, runner)


def profiled(folder: str, run: Coroutine) -> None:
    """Run the loop under cProfile, and the reader thread under a profile of its own."""
    read = CoreLink._read

    def profiled_read(link: CoreLink) -> None:
        prof = cProfile.Profile()
        prof.runcall(read, link)
        prof.dump_stats(f"{folder}/front-reader.prof")

    CoreLink._read = profiled_read  # type: ignore[method-assign]
    prof = cProfile.Profile()
    prof.runcall(asyncio.run, run)
    prof.dump_stats(f"{folder}/front-loop.prof")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--spec", required=True, help="front_core_stub.spec_json(...)")
    p.add_argument("--max-queue", type=int, default=4096)
    p.add_argument("--profile", default=None)
    args = p.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Which tree this front runs (--against puts another one first on the path).
    logging.getLogger("crucible.server").info("front of %s", Path(crucible.__file__).parent)
    run = serve(args.port, args.spec, args.max_queue)
    if args.profile:
        profiled(args.profile, run)
    else:
        asyncio.run(run)


if __name__ == "__main__":
    main()
