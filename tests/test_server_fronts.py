"""Several HTTP fronts over one engine process (server/fronts.py, ``--api-servers``).

The engine core's links (engine/core_process.py) are checked directly over pipes: each
front gets only its own requests' deltas and its own adds counted, and a front that leaves
takes only its requests (their pages come back) while the others go on. Then whole
servers of the tiny random model: three fronts on one port serve what one front serves,
spread over the fronts, with /metrics counting every front's requests; a killed front
loses only its streams; the CLI refuses what cannot work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from multiprocessing import Pipe

import pytest

from crucible.engine import core_wire as wire
from crucible.engine.core_loop import EngineCore
from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings
from crucible.server.engine_client import EngineProcessConfig
from crucible.server.launch import ServerThread
from crucible.server.state import ServerConfig
from engine_process_kit import wait_for, wait_idle

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))


def _frames(conn, until, timeout: float = 30.0) -> list[bytes]:
    """Frames from ``conn`` until ``until(frames)`` holds."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, [f[0] for f in got]
        if conn.poll(0.05):
            got.append(conn.recv_bytes())
    return got


def _deltas(frames: list[bytes]) -> list[wire.WireDelta]:
    return [w for f in frames if f[0] == wire.STEP for w in wire.decode_step(f)[1]]


def test_core_links_keep_their_fronts_apart() -> None:
    engine, _ = build_engine(*TINY)
    engine.detokenize = False
    (f0, c0), (f1, c1) = Pipe(), Pipe()
    core = EngineCore(engine, [c0, c1])
    loop = threading.Thread(target=core.run, daemon=True)
    loop.start()
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    # The same handles and request ids on both links: each front names its own requests.
    for h in (1, 2):
        f0.send_bytes(wire.encode_add(h, f"r{h}", [5, 6, 7, 8], params))
    f1.send_bytes(wire.encode_add(1, "r1", [5, 6, 7, 8], params))
    ended = lambda frames: sum(w.finish_reason is not None for w in _deltas(frames))  # noqa: E731
    on0 = _frames(f0, lambda fr: ended(fr) == 2)
    on1 = _frames(f1, lambda fr: ended(fr) == 1)
    d0, d1 = _deltas(on0), _deltas(on1)
    assert {w.handle for w in d0} == {1, 2} and {w.handle for w in d1} == {1}
    toks = lambda ds, h: [t for w in ds if w.handle == h for t in w.token_ids]  # noqa: E731
    assert toks(d0, 1) == toks(d0, 2) == toks(d1, 1) and len(toks(d1, 1)) == 6
    # Each link counts its own adds (its front's bound arithmetic), every frame the engine's.
    last0 = dict(wire.decode_step([f for f in on0 if f[0] == wire.STEP][-1])[0])
    last1 = dict(wire.decode_step([f for f in on1 if f[0] == wire.STEP][-1])[0])
    assert (last0["adds_seen"], last1["adds_seen"]) == (2, 1)
    # A long request on each link; link 1's front leaves (EOF): only its request ends, its
    # pages come back, and link 0's runs on to its end.
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    f0.send_bytes(wire.encode_add(3, "long", list(range(5, 40)), long))
    f1.send_bytes(wire.encode_add(2, "long", list(range(5, 40)), long))
    _frames(f1, lambda fr: len(_deltas(fr)) > 0)
    f1.close()
    done = _frames(f0, lambda fr: ended(fr) == 1)
    assert [w.finish_reason for w in _deltas(done) if w.finish_reason] == ["length"]
    assert len(toks(_deltas(done), 3)) == 60
    wait_for(lambda: engine.allocator.num_free == engine.allocator.num_pages
             and not engine.has_unfinished())
    assert core.open == [True, False] and core.handles == {}
    # Metrics pushed by link 0 come back as nothing (no other front is left).
    f0.send_bytes(wire.encode_json(wire.FRONT_METRICS, {"metrics": {"x": 1}}))
    reply = _frames(f0, lambda fr: any(f[0] == wire.FRONTS for f in fr))
    assert wire.decode_json([f for f in reply if f[0] == wire.FRONTS][0])["fronts"] == []
    f0.send_bytes(bytes([wire.SHUTDOWN]))
    loop.join(10)
    assert not loop.is_alive()


def test_the_core_checks_what_a_front_sends() -> None:
    """The fronts check each request before sending it; the engine process checks again (on
    the wire's array), so ids no front should have sent are refused, named, and the engine
    goes on serving with every page back."""
    engine, _ = build_engine(*TINY)
    engine.detokenize = False
    f0, c0 = Pipe()
    core = EngineCore(engine, [c0])
    loop = threading.Thread(target=core.run, daemon=True)
    loop.start()
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    vocab = engine.vocab_size
    f0.send_bytes(wire.encode_add(1, "bad", [5, vocab, -1], params))
    refused = _frames(f0, lambda fr: any(f[0] == wire.REFUSED for f in fr))
    body = wire.decode_json([f for f in refused if f[0] == wire.REFUSED][0])
    assert body["handle"] == 1 and body["kind"] == "request"
    assert f"prompt token id {vocab} is outside the vocabulary" in body["message"]
    f0.send_bytes(wire.encode_add(2, "good", [5, 6, 7], params))
    done = _frames(f0, lambda fr: any(w.finish_reason for w in _deltas(fr)))
    assert len([t for w in _deltas(done) if w.handle == 2 for t in w.token_ids]) == 3
    wait_for(lambda: engine.allocator.num_free == engine.allocator.num_pages
             and not engine.has_unfinished())
    f0.send_bytes(bytes([wire.SHUTDOWN]))
    loop.join(10)
    assert not loop.is_alive()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Connection": "close"})  # a new connection each
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _stream_text(url: str, body: dict) -> str:
    req = urllib.request.Request(url + "/v1/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Connection": "close"})
    text, done = [], False
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    assert done
    return "".join(text)


def _metrics(url: str, *starts: str) -> list[float]:
    """One scrape (of whichever front the connection reaches): the sum of each series."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return [sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(s))
            for s in starts]


def test_three_fronts_serve_one_engine() -> None:
    body = {"model": "tiny-random", "prompt": "the quick brown fox", "max_tokens": 12,
            "temperature": 0}
    with ServerThread(EngineProcessConfig(*TINY), ServerConfig(model_name="tiny-random")) as one:
        want = _post(one.url, body)["choices"][0]["text"]
    srv = ServerThread(EngineProcessConfig(*TINY), ServerConfig(model_name="tiny-random"),
                       fronts=3).start()
    try:
        assert len(srv.state.front_procs) == 2
        n = 45
        texts = [_post(srv.url, body)["choices"][0]["text"] for _ in range(n)]
        streamed = [_stream_text(srv.url, body) for _ in range(15)]
        assert set(texts) == set(streamed) == {want}
        here = srv.state.metrics.finished["length"]
        assert 0 < here < n + 15  # the other fronts took a share (3 sockets, 60 connections)
        # Any front's /metrics counts every front's requests (the others' as of their last
        # push): once every front has pushed, each scrape, whichever front answers, adds up.
        want_metrics, streak, seen = [n + 15, n + 15, 12 * (n + 15)], 0, []
        deadline = time.monotonic() + 20
        while streak < 8:  # eight scrapes in a row, whichever fronts answer them
            got = _metrics(srv.url, 'crucible_requests_finished_total{reason="length"}',
                           "crucible_time_to_first_token_seconds_count",
                           "crucible_generation_tokens_total")
            seen.append(got)
            streak = streak + 1 if got == want_metrics else 0
            assert time.monotonic() < deadline, seen[-10:]
            time.sleep(0.1)
        wait_idle(srv, timeout=15)
    finally:
        srv.stop()
    assert [p.exitcode for p in srv.state.front_procs] == [0, 0]


def test_a_dead_front_loses_only_its_streams() -> None:
    srv = ServerThread(EngineProcessConfig(*TINY), ServerConfig(model_name="tiny-random"),
                       fronts=2).start()
    try:
        other = srv.state.front_procs[0]
        long = {"model": "tiny-random", "prompt": "a b c", "max_tokens": 400,
                "temperature": 0, "ignore_eos": True, "stream": True}
        resp = None
        for _ in range(40):  # until a stream lands on the other front
            req = urllib.request.Request(srv.url + "/v1/completions",
                                         data=json.dumps(long).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Connection": "close"})
            r = urllib.request.urlopen(req, timeout=30)
            r.readline()  # its first event: it runs
            if srv.engine_stats()["running"] == 1 and not srv.state.engine_loop._live:
                resp = r
                break
            r.close()
            wait_idle(srv, timeout=15)
        assert resp is not None, "no stream landed on the second front"
        os.kill(other.pid, signal.SIGKILL)
        other.join(10)
        wait_idle(srv, timeout=15)  # the engine ended that front's request: every page is back
        body = {"model": "tiny-random", "prompt": "still here", "max_tokens": 4}
        for _ in range(5):  # the port now leads to the first front alone
            assert _post(srv.url, body)["choices"][0]["finish_reason"] == "length"
        health = urllib.request.urlopen(srv.url + "/health", timeout=10)
        assert health.status == 200
    finally:
        srv.stop()


@pytest.mark.parametrize("argv, message", [
    (["--api-servers", "2", "--engine-in-process"], "needs the engine in its own process"),
    (["--api-servers", "0"], "--api-servers"),
])
def test_cli_refuses_fronts_it_cannot_run(argv: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "crucible", "serve", "--model", "tiny-random",
                          "--device", "cpu", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_fronts_default_to_two_on_a_gpu_only() -> None:
    from crucible.cli_serve import SERVE_CUDA_FRONTS, default_fronts, parser

    assert parser().parse_args([]).api_servers is None  # the device decides
    assert SERVE_CUDA_FRONTS == 2 and default_fronts("cuda", False) == 2
    assert default_fronts("cpu", False) == 1
    assert default_fronts("cuda", True) == 1  # one process: no second front to run


def test_every_front_reports_a_dead_engine() -> None:
    """The engine process killed: every front's /health turns 503 naming it (each front's
    link sees the pipe close), whichever front a probe reaches; nothing hangs."""
    srv = ServerThread(EngineProcessConfig(*TINY), ServerConfig(model_name="tiny-random"),
                       fronts=2).start()
    try:
        os.kill(srv.state.engine_loop.pid, signal.SIGKILL)
        deadline, streak = time.monotonic() + 20, 0
        while streak < 12:  # a dozen probes in a row over new connections: both fronts
            req = urllib.request.Request(srv.url + "/health", headers={"Connection": "close"})
            try:
                urllib.request.urlopen(req, timeout=10)
                streak = 0
            except urllib.error.HTTPError as e:
                body = json.loads(e.read())
                assert e.code == 503 and "engine process" in body["detail"], body
                streak += 1
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        srv.stop()
