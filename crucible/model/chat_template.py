"""Render chat prompts with the model's own Jinja template, in a sandbox.

Templates come from model files (the GGUF's ``tokenizer.chat_template`` or an HF
``tokenizer_config.json``), so they are untrusted code: they run in jinja2's immutable
sandbox, which refuses attribute tricks and in-place mutation. The environment offers what
HF-style templates expect: ``raise_exception``, ``strftime_now``, a ``tojson`` that does not
HTML-escape, the loop-controls extension, and trim_blocks/lstrip_blocks.

Messages are checked before rendering so that a bad request fails with a RequestError that
names the message, rather than with whatever the template happens to do with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from crucible.errors import RequestError

# Used only when a model ships no template (the tiny test tokenizer uses it on purpose).
# Every turn is "<|im_start|>{role}\n{content}<|im_end|>\n"; the generation prompt opens an
# assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_ALLOWED_ROLES = {"system", "user", "assistant", "tool", "developer", "function", "ipython"}


class TemplateRejected(RequestError):
    """The template itself refused the conversation (its ``raise_exception`` fired)."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRejected(f"chat template rejected the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes <, >, & for HTML; a prompt must carry them verbatim.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check an OpenAI-style message list; return plain-dict copies the template may read.

    Each message needs a string ``role`` from the usual set and a string ``content``.
    Extra keys (``name``, ``tool_calls`` ...) pass through for templates that use them.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise RequestError("messages must be a list of {role, content} objects")
    if not messages:
        raise RequestError("messages must not be empty")
    checked: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise RequestError(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str):
            raise RequestError(f"messages[{i}] has no string 'role'")
        if role not in _ALLOWED_ROLES:
            raise RequestError(f"messages[{i}].role {role!r} is not one of "
                               f"{', '.join(sorted(_ALLOWED_ROLES))}")
        if "content" not in msg:
            raise RequestError(f"messages[{i}] has no 'content'")
        if not isinstance(msg["content"], str):
            raise RequestError(f"messages[{i}].content must be a string, "
                               f"got {type(msg['content']).__name__}")
        checked.append(dict(msg))
    return checked


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        # A syntax error surfaces here (at load time), not on the first request.
        self._template = env.from_string(source)
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(self, messages: Any, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt text for ``messages``; ``extra`` become template variables."""
        checked = validate_messages(messages)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
                     "messages": checked, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**variables)
        except RequestError:
            raise
        except jinja2.TemplateError as exc:  # includes sandbox SecurityError
            raise RequestError(f"chat template failed to render: {exc}") from exc
        except (TypeError, KeyError, ValueError) as exc:
            raise RequestError(f"chat template failed on these messages: {exc}") from exc
