"""The chat's two terminals: prompt_toolkit on a terminal, plain line reads from a pipe.

Both read one message at a time (None at end of input) and ask yes/no questions. On a
terminal, prompt_toolkit gives line editing, history (Up/Down), Tab completion of the
commands and multi-line input, and handles SIGWINCH while it reads; a reply streams while
no prompt is active, so a resize then only re-wraps plain text the terminal already owns.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterable, Iterator, Protocol

from prompt_toolkit import PromptSession, prompt
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

PROMPT = "you> "
CONTINUATION = "...  "  # as wide as the prompt, so continued lines line up
NEWLINE_KEYS = "Esc+Enter (or Alt+Enter) or a trailing \\ starts a new line"


class Terminal(Protocol):
    interactive: bool

    def read(self) -> str | None: ...

    def confirm(self, question: str) -> bool: ...

    def streaming(self) -> ContextManager[None]: ...


def open_terminal(history_file: str | None, commands: Iterable[str]) -> Terminal:
    """prompt_toolkit when stdin and stdout are terminals; plain reads otherwise."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return TtyTerminal(history_file, commands)
    return PipeTerminal()


class PipeTerminal:
    """Line by line from a pipe or file; a line ending in a backslash continues."""

    interactive = False

    def read(self) -> str | None:
        lines: list[str] = []
        prompt = PROMPT
        while True:
            try:
                line = input(prompt).rstrip("\r")
            except EOFError:
                return "\n".join(lines) if lines else None
            if line.endswith("\\"):
                lines.append(line[:-1])
                prompt = CONTINUATION
                continue
            lines.append(line)
            return "\n".join(lines)

    def confirm(self, question: str) -> bool:
        # Nobody is there to ask: a script's /reset means it.
        return True

    def streaming(self) -> ContextManager[None]:
        return nullcontext()


class TtyTerminal:
    interactive = True

    def __init__(self, history_file: str | None, commands: Iterable[str]) -> None:
        history = FileHistory(history_file) if history_file else InMemoryHistory()
        self._session: PromptSession = PromptSession(
            history=history, key_bindings=_bindings(), multiline=True,
            prompt_continuation=CONTINUATION, completer=_CommandCompleter(tuple(commands)),
            complete_while_typing=False)

    def read(self) -> str | None:
        try:
            return self._session.prompt(PROMPT)
        except EOFError:  # Ctrl-D on an empty line
            return None

    def confirm(self, question: str) -> bool:
        try:
            return prompt(question).strip().lower() in ("y", "yes")
        except (EOFError, KeyboardInterrupt):
            return False

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """While a reply streams, keys typed are neither echoed into it nor held by the
        line discipline: they wait, raw, for the next prompt (so Ctrl-D typed ahead is a
        key there, not an end of input). ISIG stays on, so Ctrl-C still signals."""
        saved = _tty_modes()
        if saved is None:  # no termios (Windows), or stdin is no terminal after all
            yield
            return
        import termios

        fd = sys.stdin.fileno()
        quiet = termios.tcgetattr(fd)
        quiet[3] &= ~(termios.ECHO | termios.ICANON)
        quiet[6][termios.VMIN], quiet[6][termios.VTIME] = 1, 0
        termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSAFLUSH would drop typeahead
        try:
            yield
        finally:
            termios.tcsetattr(fd, termios.TCSANOW, saved)


def _tty_modes() -> list | None:
    """stdin's terminal modes, or None without termios (Windows) or a terminal."""
    try:
        import termios
    except ImportError:
        return None
    try:
        return termios.tcgetattr(sys.stdin.fileno())
    except (termios.error, OSError, ValueError):
        return None


def _bindings() -> KeyBindings:
    """Enter sends; Esc+Enter, or Enter after a trailing backslash, adds a line."""
    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buf = event.current_buffer
        if buf.document.text_before_cursor.endswith("\\"):
            buf.delete_before_cursor(1)
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    return kb


class _CommandCompleter(Completer):
    """Tab completes a /command typed at the start of the input."""

    def __init__(self, commands: tuple[str, ...]) -> None:
        self._commands = commands

    def get_completions(self, document: Document,
                        complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or " " in text or "\n" in text:
            return
        for name in self._commands:
            if name.startswith(text):
                yield Completion(name, start_position=-len(text))
