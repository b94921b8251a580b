"""The read loop and the /commands of ``llm-engine chat``.

A line that starts with one slash is a command; ``//text`` sends ``/text`` as a message. On a
terminal an empty line does nothing; from a pipe it ends the session (scripts written for
the old chat end that way), as end of input does everywhere.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from crucible.chat.session import ChatSession
from crucible.chat.term import NEWLINE_KEYS

SAVE_FORMAT = "crucible-chat/1"
COMMANDS = ("/help", "/reset", "/system", "/stats", "/save", "/exit", "/quit")
HELP = f"""commands:
  /system TEXT  set the system prompt: it applies from the next reply on and the
                conversation is kept (/reset to start over); /system shows it, /system - clears it
  /reset        start the conversation over (asks y/N; the system prompt stays)
  /stats        tokens, ttft and tok/s of the last reply, and the totals so far
  /save FILE    write the conversation as JSON
  /help         this list
  /exit         quit (or /quit, or Ctrl-D)
  //text        send a message that starts with a slash
keys:
  Enter sends; {NEWLINE_KEYS}
  Up/Down recall earlier messages; Tab completes a command
  Ctrl-C stops a reply (the chat stays; the turn is dropped) or clears the line
  Ctrl-D on an empty line quits"""


def banner(session: ChatSession) -> list[str]:
    b = session.backend
    lines = [f"Crucible chat | model {b.model} | {b.where} | max-tokens {b.max_tokens}",
             f"Enter sends | {NEWLINE_KEYS} | Ctrl-C stops a reply | "
             f"Ctrl-D or /exit quits | /help for commands"]
    if session.system:
        lines.append(f"system prompt: {session.system}")
    return lines


def run(session: ChatSession) -> int:
    """Read and answer until end of input or /exit; 0 on a clean exit."""
    interactive = session.term.interactive
    show = session.say if interactive else session.warn  # a pipe's stdout: only the chat
    for line in banner(session):
        show(line)
    while True:
        try:
            text = session.term.read()
        except KeyboardInterrupt:  # at the prompt: drop the line, stay in the chat
            continue
        if text is None or not text.strip() and not interactive or _ran(session, text):
            # prompt_toolkit ends its line on Ctrl-D or Enter; a pipe echoes no newline,
            # so the last "you> " still needs one.
            if not interactive:
                session.out.write("\n")
                session.out.flush()
            return 0
        text = text.strip()
        if text and not _is_command(text):
            try:
                session.turn(text[1:] if text.startswith("//") else text)
            except KeyboardInterrupt:  # a second Ctrl-C while the first one was handled
                session.backend.settle()
                session.say("\n[cancelled; this turn is not kept]")


def _is_command(text: str) -> bool:
    return text.startswith("/") and not text.startswith("//")


def _ran(session: ChatSession, text: str) -> bool:
    """Run ``text`` if it is a command; True when that command ends the chat."""
    text = text.strip()
    return _is_command(text) and command(session, text) == "exit"


def command(session: ChatSession, text: str) -> str | None:
    name, *rest = text.split(None, 1)
    arg = rest[0] if rest else ""
    handler = _HANDLERS.get(name)
    if handler is None:
        session.warn(f"[unknown command {name!r}; /help lists the commands, //text sends "
                     f"text that starts with a slash]")
        return None
    return handler(session, arg.strip())


def _help(session: ChatSession, arg: str) -> None:
    session.say(HELP)


def _exit(session: ChatSession, arg: str) -> str:
    return "exit"


def _reset(session: ChatSession, arg: str) -> None:
    if not session.term.confirm("Reset the conversation? [y/N] "):
        session.say("[not reset]")
        return
    session.turns.clear()
    kept = " (the system prompt is kept)" if session.system else ""
    session.say(f"[conversation reset{kept}]")


def _system(session: ChatSession, arg: str) -> None:
    if not arg:
        now = f"system prompt: {session.system}" if session.system else "no system prompt"
        session.say(f"[{now}; /system TEXT sets it, /system - clears it]")
    elif arg == "-":
        session.system = None
        session.say("[system prompt cleared; the conversation is kept]")
    else:
        session.system = arg
        session.say("[system prompt set: it applies from the next reply on; the "
                    "conversation is kept (/reset starts over)]")


def _rate(tokens: int, seconds: float | None) -> str:
    return "-" if tokens < 1 or not seconds else f"{tokens / seconds:.1f}"


def _stats(session: ChatSession, arg: str) -> None:
    r, t = session.last, session.totals
    if r is None:
        session.say("last reply: none yet")
    else:
        ttft = "-" if r.ttft_s is None else f"{r.ttft_s * 1000:.0f} ms"
        rate = "-" if r.decode_tok_s is None else f"{r.decode_tok_s:.1f}"
        prompt = "?" if r.prompt_tokens is None else str(r.prompt_tokens)
        cached = f" ({r.cached_tokens} cached)" if r.cached_tokens else ""
        session.say(f"last reply: {r.generated_tokens} tokens ({r.finish_reason}) | prompt "
                    f"{prompt} tokens{cached} | ttft {ttft} | decode {rate} tok/s | "
                    f"{r.elapsed_s:.2f} s")
    session.say(f"totals: replies {t.replies} ({t.cancelled} cancelled, {t.cut} cut) | "
                f"{t.generated_tokens} tokens generated in {t.seconds:.2f} s "
                f"({_rate(t.generated_tokens, t.seconds)} tok/s) | {t.prompt_tokens} "
                f"prompt tokens | {len(session.turns)} messages kept")
    if (engine := session.backend.engine_line()) is not None:
        session.say(engine)


def _save(session: ChatSession, arg: str) -> None:
    if not arg:
        session.warn("[/save needs a file name: /save FILE]")
        return
    path = Path(os.path.expanduser(arg))
    doc = {"format": SAVE_FORMAT, "model": session.backend.model,
           "source": session.backend.where, "system": session.system,
           "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "messages": session.messages()}
    try:
        path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n",
                        encoding="utf-8", errors="replace")
    except OSError as exc:
        session.warn(f"[cannot save to {str(path)!r}: {exc.strerror or exc}]")
        return
    session.say(f"[saved {len(doc['messages'])} messages to {str(path)!r}]")


_HANDLERS: dict[str, Callable[[ChatSession, str], str | None]] = {
    "/help": _help, "/exit": _exit, "/quit": _exit, "/reset": _reset, "/system": _system,
    "/stats": _stats, "/save": _save}
