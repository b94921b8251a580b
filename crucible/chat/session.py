"""The conversation: read a message, stream the reply, keep the turns and the counters.

A turn that is cancelled (Ctrl-C) or fails is dropped from the conversation, so the next
prompt carries only complete exchanges; a reply cut at max-tokens is kept, with a marker.
The /commands live in commands.py; this file holds the state they act on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol, TextIO

from crucible.chat.reply import Reply, ReplyMeter, run_cancellable
from crucible.chat.term import Terminal
from crucible.errors import CrucibleError

REPLY_PREFIX = "assistant> "


class Backend(Protocol):
    model: str
    where: str  # "device cpu, weights int8" or "server http://..."
    max_tokens: int

    async def reply(self, messages: list[dict[str, str]], meter: ReplyMeter) -> None: ...

    def settle(self) -> None: ...

    def engine_line(self) -> str | None: ...

    def stats_line(self, reply: Reply) -> str: ...


@dataclass
class Totals:
    replies: int = 0
    cancelled: int = 0
    cut: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0

    def count(self, reply: Reply) -> None:
        self.replies += 1
        self.cancelled += reply.finish_reason == "cancelled"
        self.cut += reply.finish_reason == "length"
        self.prompt_tokens += reply.prompt_tokens or 0
        self.generated_tokens += reply.generated_tokens
        self.seconds += reply.elapsed_s


class ChatSession:
    def __init__(self, backend: Backend, term: Terminal, *, system: str | None,
                 show_stats: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.backend = backend
        self.term = term
        self.system = system
        self.show_stats = show_stats
        self.out, self.err = out, err
        self.turns: list[dict[str, str]] = []  # user and assistant messages, in order
        self.last: Reply | None = None
        self.totals = Totals()

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def warn(self, text: str) -> None:
        self.out.flush()  # keep the order on a terminal that shows both streams
        self.err.write(text + "\n")
        self.err.flush()

    def _echo(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def turn(self, text: str) -> None:
        """Send one user message and stream the reply to the end, a cancel or an error;
        the exchange joins the conversation only when the reply ended by itself."""
        messages = self.messages() + [{"role": "user", "content": text}]
        self._echo(REPLY_PREFIX)
        meter = ReplyMeter(self._echo)
        try:
            with self.term.streaming():
                cancelled = run_cancellable(lambda: self.backend.reply(messages, meter))
        except CrucibleError as exc:  # refused, or the server or engine failed: say so
            self.backend.settle()
            self._echo("\n")
            self.warn(f"[error: {exc}]")
            return
        except KeyboardInterrupt:  # landed just outside the reply's task
            cancelled = True
        if cancelled:
            meter.finish("cancelled")
            self.backend.settle()
        reply = meter.result()
        self.last = reply
        self.totals.count(reply)
        if not reply.text.endswith("\n"):
            self._echo("\n")
        if cancelled:
            self.say(f"[cancelled after {reply.generated_tokens} tokens; this turn is not "
                     f"kept]")
        else:
            self.turns += messages[-1:] + [{"role": "assistant", "content": reply.text}]
            if reply.finish_reason == "length":
                self.say(self._cut_marker(reply))
        if self.show_stats:
            self.warn(self.backend.stats_line(reply))

    def _cut_marker(self, reply: Reply) -> str:
        if reply.generated_tokens >= self.backend.max_tokens:
            return f"[cut at max-tokens {self.backend.max_tokens}]"
        return "[cut at the model's context length; /reset starts over]"
