"""bench/front_core_stub.py's fake engine under the real engine-process loop
(engine/core_loop.py), as bench/front_capacity.py runs it: it must answer everything
EngineCore asks (it once lacked ``pacer``, and the front-capacity bench could not start)
and stream its ids through the real wire."""

from __future__ import annotations

import sys
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from front_core_stub import fake_engine, spec_json  # noqa: E402

from crucible.engine import core_wire as wire  # noqa: E402
from crucible.engine.core_loop import EngineCore  # noqa: E402
from crucible.engine.sampling import SamplingParams  # noqa: E402
from crucible.engine.settings import Settings  # noqa: E402


def test_the_fake_engine_serves_through_the_engine_loop() -> None:
    engine, info = fake_engine(spec_json("tiny-random", 2000.0), Settings(max_queue=8))
    front, back = Pipe()
    core = EngineCore(engine, back)
    loop = threading.Thread(target=core.run, daemon=True)
    loop.start()
    front.send_bytes(wire.encode_add(7, "r7", [5, 6, 7], SamplingParams(max_tokens=5)))
    ids: list[int] = []
    finish = None
    deadline = time.monotonic() + 20
    while finish is None:
        assert time.monotonic() < deadline
        if front.poll(0.05):
            frame = front.recv_bytes()
            if frame[0] == wire.STEP:
                for w in wire.decode_step(frame)[1]:
                    assert w.handle == 7
                    ids += w.token_ids
                    finish = w.finish_reason or finish
    assert finish == "length" and len(ids) == 5 and info.max_queue == 8
    front.send_bytes(bytes([wire.SHUTDOWN]))
    loop.join(10)
    assert not loop.is_alive()
