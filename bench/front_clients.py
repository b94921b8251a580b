"""Streaming clients for the front-capacity bench, in a process of their own.

    python3 bench/front_clients.py --port P --clients 256 --t0 T0 --t1 T1 --seed 0

Each client keeps one HTTP/1.1 keep-alive connection and sends ``/v1/completions``
requests (stream=true, a prompt of 20-200 random words, ``max_tokens`` 32-96 by default,
``ignore_eos``) back to back until ``--t1``. The clients are a bare epoll loop over
non-blocking sockets, not aiohttp, an SDK or even asyncio's transports: they share a core
with the fake engine and must stay far cheaper per chunk than the front they measure
(asyncio alone cost about 30 us a chunk here). A client counts SSE events (each ends with a
blank line, which neither the chunked framing nor the headers contain) and stamps each
read, nothing more. A read carrying k events counts one gap since the previous read and
k-1 gaps of zero, which is what a client reading that socket sees.

Only reads inside [t0, t1] (``time.monotonic``, shared by every process on the machine)
count. Prints one JSON line: chunks, requests, errors, TTFTs and gaps (seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import select
import socket
import time

WORDS = ("the cat sat on a mat while seven quick foxes ran past old river stones under "
         "grey autumn skies and nobody noticed").split()
_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body


class Tally:
    def __init__(self, t0: float, t1: float, max_tokens: tuple[int, int]) -> None:
        self.t0, self.t1, self.max_tokens = t0, t1, max_tokens
        self.chunks = self.requests = self.errors = 0
        self.ttft: list[float] = []
        self.gaps: list[float] = []


class Client:
    """One connection and its request in flight."""

    def __init__(self, sock: socket.socket, head: str, model: str, rng: random.Random,
                 tally: Tally) -> None:
        self.sock, self.head, self.model, self.rng, self.tally = sock, head, model, rng, tally
        self.open = True

    def send(self) -> None:
        if time.monotonic() >= self.tally.t1:
            self.open = False
            return
        rng = self.rng
        body = json.dumps({"model": self.model,
                           "prompt": " ".join(rng.choices(WORDS, k=rng.randint(20, 200))),
                           "max_tokens": rng.randint(*self.tally.max_tokens),
                           "temperature": 0.7,
                           "stream": True, "ignore_eos": True}).encode()
        self.in_head, self.buf, self.last_byte, self.tail = True, b"", b"", b""
        self.t_sent, self.t_last = time.monotonic(), None
        data = (self.head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        sent = self.sock.send(data)  # the previous response is read: the buffer is empty
        if sent < len(data):
            self.sock.setblocking(True)
            self.sock.sendall(data[sent:])
            self.sock.setblocking(False)

    def on_data(self, data: bytes, now: float) -> None:
        t = self.tally
        if not data:  # the server closed the connection
            if now < t.t1:
                t.errors += 1
            self.open = False
            return
        if self.in_head:
            self.buf += data
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            self.in_head, self.buf = False, b""
            if not head.startswith(b"HTTP/1.1 200"):
                t.errors += 1
                self.open = False
                return
            data = rest
            if not data:
                return
        events = (self.last_byte + data).count(b"\n\n")
        self.last_byte = data[-1:]
        window = self.tail + data
        self.tail = window[-len(_END):]
        ended = window.endswith(_END)
        if ended:
            events -= 1  # data: [DONE]
        if events > 0:
            if t.t0 <= now <= t.t1:
                t.chunks += events
                if self.t_last is None:
                    t.ttft.append(now - self.t_sent)
                else:
                    t.gaps.append(now - self.t_last)
                if events > 1:
                    t.gaps.extend([0.0] * (events - 1))
            self.t_last = now
        if ended:
            if t.t0 <= now <= t.t1:
                t.requests += 1
            self.send()


def run(args: argparse.Namespace) -> dict:
    lo, _, hi = args.max_tokens.partition(",")
    tally = Tally(args.t0, args.t1, (int(lo), int(hi or lo)))
    rng = random.Random(args.seed)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {args.host}:{args.port}\r\n"
            "Content-Type: application/json\r\n")
    ep = select.epoll()
    clients: dict[int, Client] = {}
    for _ in range(args.clients):
        sock = socket.create_connection((args.host, args.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        c = Client(sock, head, args.model, random.Random(rng.random()), tally)
        clients[sock.fileno()] = c
        c.send()
        ep.register(sock.fileno(), select.EPOLLIN)
    deadline = args.t1 + 60.0  # every client stops at its first request boundary after t1
    woke = 0.0
    while clients and time.monotonic() < deadline:
        # At most one poll per ``--poll-ms``: a wake-up costs the kernel more than the
        # reads, and gathering the chunks of a step into one wake-up keeps the clients
        # cheap; gaps are then measured to within that interval.
        pause = woke + args.poll_ms / 1000 - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        events = ep.poll(1.0)
        woke = time.monotonic()
        for fd, _ in events:
            c = clients[fd]
            try:
                data = c.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            c.on_data(data, time.monotonic())
            if not c.open:
                ep.unregister(fd)
                c.sock.close()
                del clients[fd]
    return {"chunks": tally.chunks, "requests": tally.requests, "errors": tally.errors,
            "ttft": tally.ttft, "gaps": tally.gaps}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="front-bench")
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--t1", type=float, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", default="32,96", help="LO,HI: drawn uniformly per request")
    p.add_argument("--poll-ms", type=float, default=1)
    print(json.dumps(run(p.parse_args())))
