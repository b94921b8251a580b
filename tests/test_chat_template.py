"""Chat template rendering: ChatML fallback, HF-style helpers, sandboxing, message checks.

Expected prompts are written out by hand from the ChatML format: every turn is
"<|im_start|>{role}\\n{content}<|im_end|>\\n" and the generation prompt opens an assistant
turn. SmolLM2's own template is checked against the real GGUF in test_tokenizer_gguf.py.
"""

from __future__ import annotations

import pytest

from crucible.errors import RequestError
from crucible.model.chat_template import ChatTemplate, TemplateRejected
from crucible.model.tokenizer import Tokenizer
from crucible.model.tiny_tokenizer import tiny_tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
]
CHATML = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
          "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
          "<|im_start|>assistant\n4.<|im_end|>\n")


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return tiny_tokenizer()


def test_chatml_fallback(tiny: Tokenizer) -> None:
    assert not tiny.has_chat_template
    assert tiny.apply_chat_template(CONVERSATION, add_generation_prompt=False) == CHATML
    assert tiny.apply_chat_template(CONVERSATION) == CHATML + "<|im_start|>assistant\n"


def test_chat_prompt_ids(tiny: Tokenizer) -> None:
    ids = tiny.encode_chat(CONVERSATION[:2])
    # <|im_start|> = 270 opens each turn, <|im_end|> = 271 closes it, newline is byte 10.
    assert ids[:2] == [270, tiny.encode("system")[0]]
    assert [i for i in ids if i in (270, 271)] == [270, 271, 270, 271, 270]
    assert ids[-2:] == tiny.encode("assistant")[-1:] + [10]
    assert tiny.decode(ids) == tiny.apply_chat_template(CONVERSATION[:2])


def test_special_variables_and_helpers() -> None:
    tpl = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}{{ eos_token }}"
        "|{{ strftime_now('%Y') | length }}|{{ extra_var }}",
        bos_token="<s>", eos_token="</s>")
    out = tpl.render([{"role": "user", "content": "a<b>&\"é"}], extra_var="x")
    # tojson keeps <, >, & and non-ASCII verbatim (jinja2's own filter would escape them).
    assert out == '<s>{"role": "user", "content": "a<b>&\\"é"}</s>|4|x'


def test_trim_blocks_and_loop_controls() -> None:
    tpl = ChatTemplate("{% for m in messages %}\n"
                       "  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
                       "{{ m['content'] }};\n"
                       "{% endfor %}")
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indent before one.
    assert tpl.render(CONVERSATION, add_generation_prompt=False) == "What is 2+2?;\n4.;\n"


def test_raise_exception_is_a_request_error() -> None:
    tpl = ChatTemplate("{% if messages[0]['role'] != 'user' %}"
                       "{{ raise_exception('first message must be from the user') }}{% endif %}ok")
    assert tpl.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateRejected, match="must be from the user"):
        tpl.render(CONVERSATION)
    assert issubclass(TemplateRejected, RequestError)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # classic sandbox escape
    "{% set _ = messages.append(1) %}x",               # mutating the caller's data
    "{{ messages[0].content.nope.deeper() }}",         # calling an undefined value
])
def test_sandbox_refuses(source: str) -> None:
    with pytest.raises(RequestError, match="chat template"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


BAD_MESSAGES = [
    ("not a list", "must be a list"),
    ([], "must not be empty"),
    (["hello"], r"messages\[0\] must be an object"),
    ([{"content": "x"}], r"messages\[0\] has no string 'role'"),
    ([{"role": "user", "content": "x"}, {"role": "wizard", "content": "x"}],
     r"messages\[1\]\.role 'wizard'"),
    ([{"role": "user"}], r"messages\[0\] has no 'content'"),
    ([{"role": "user", "content": None}], "content must be a string, got NoneType"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "got list"),
]


@pytest.mark.parametrize("messages,needle", BAD_MESSAGES, ids=[n for _, n in BAD_MESSAGES])
def test_bad_messages(tiny: Tokenizer, messages: object, needle: str) -> None:
    with pytest.raises(RequestError, match=needle):
        tiny.apply_chat_template(messages)  # type: ignore[arg-type]


def test_messages_are_not_mutated(tiny: Tokenizer) -> None:
    conv = [dict(m) for m in CONVERSATION]
    tiny.apply_chat_template(conv)
    assert conv == CONVERSATION
