"""Load a Tokenizer from model files: a GGUF's metadata or an HF tokenizer.json directory.

Every failure becomes a ModelLoadError that names the file and what is wrong with it, so a
user with a bad download learns which file to replace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer as HFTokenizer

from crucible.errors import ModelLoadError
from crucible.model.bpe_build import build_byte_level_bpe
from crucible.model.config import flag, whole_number
from crucible.model.tokenizer import Tokenizer

_KEY = "tokenizer.ggml."


def _field(reader: Any, key: str, path: Path, required: bool = True) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {key!r}")
        return None
    try:
        return field.contents()
    except Exception as exc:  # a malformed value, whatever gguf raises for it
        raise ModelLoadError(f"{path}: cannot read GGUF metadata {key!r}: {exc}") from exc


def _list_of(value: Any, kind: type, key: str, path: Path) -> list:
    """A metadata array whose items are all ``kind``: a scalar or an array of another type
    would otherwise fail deep in the BPE build as an AttributeError."""
    if not isinstance(value, list) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise ModelLoadError(f"{path}: GGUF metadata {key!r} must be an array of "
                             f"{kind.__name__}, got {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"an array of {', '.join(kinds) or 'nothing'}"
    return f"{type(value).__name__} {value!r}"[:80]


def _text(reader: Any, key: str, path: Path) -> str | None:
    value = _field(reader, key, path, required=False)
    if value is not None and not isinstance(value, str):
        raise ModelLoadError(f"{path}: GGUF metadata {key!r} must be a string, got "
                             f"{_describe(value)}")
    return value


def load_gguf_tokenizer(path: Path, reader: Any = None) -> Tokenizer:
    if reader is None:
        from crucible.model.gguf_loader import open_gguf

        reader = open_gguf(path)
    kind = _field(reader, _KEY + "model", path)
    if kind != "gpt2":
        raise ModelLoadError(f"{path}: tokenizer model {kind!r} is not supported "
                             "(only byte-level BPE, tokenizer.ggml.model = 'gpt2')")
    tokens = _list_of(_field(reader, _KEY + "tokens", path), str, _KEY + "tokens", path)
    merges = _list_of(_field(reader, _KEY + "merges", path), str, _KEY + "merges", path)
    types = _field(reader, _KEY + "token_type", path, required=False)
    if types is not None:
        types = _list_of(types, int, _KEY + "token_type", path)
    # GGUFs written before the key existed use the GPT-2 split (llama.cpp's "default").
    pre = _text(reader, _KEY + "pre", path) or "default"
    try:
        backend = build_byte_level_bpe(tokens, merges, types, pre)
    except Exception as exc:  # ValueError from the build; tokenizers raises bare Exceptions
        raise ModelLoadError(f"{path}: bad tokenizer metadata: {exc}") from exc

    def token_id(name: str) -> int | None:
        key = f"{_KEY}{name}_token_id"
        value = _field(reader, key, path, required=False)
        if value is None:
            return None
        value = whole_number(str(path), key, value)
        if not 0 <= value < len(tokens):
            raise ModelLoadError(f"{path}: {key} = {value} is outside the "
                                 f"vocabulary of {len(tokens)} tokens")
        return value

    template = _text(reader, "tokenizer.chat_template", path)
    add_bos = _field(reader, _KEY + "add_bos_token", path, required=False)
    return _make(path, backend, bos=token_id("bos"), eos=token_id("eos"),
                 add_bos=add_bos is not None and flag(str(path), _KEY + "add_bos_token",
                                                      add_bos),
                 template=template, byte_level=True)


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes tokens either as "<s>" or as {"content": "<s>", ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any, source: Path) -> str | None:
    # Newer configs may hold a list of named templates; "default" is the chat one.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if value is not None and not isinstance(value, str):  # else the chat silently has none
        raise ModelLoadError(f"{source}: chat_template must be a string or a list of named "
                             f"templates, got {_describe(value)}")
    return value


def _stop_ids(value: Any, source: Path, vocab_size: int) -> list[int]:
    """generation_config.json's eos_token_id: one id or a list of ids, each in the
    vocabulary (a stop id no token can have never stops anything)."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    ids = [whole_number(str(source), "eos_token_id", v) for v in items]
    for tid in ids:
        if not 0 <= tid < vocab_size:
            raise ModelLoadError(f"{source}: eos_token_id {tid} is outside the vocabulary of "
                                 f"{vocab_size} tokens")
    return ids


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def load_hf_tokenizer(directory: Path) -> Tokenizer:
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelLoadError(f"{directory}: no tokenizer.json (HF-format directory expected)")
    try:
        backend = HFTokenizer.from_file(str(tok_file))
    except Exception as exc:
        raise ModelLoadError(f"{tok_file}: not a loadable tokenizer.json: {exc}") from exc
    cfg_file = directory / "tokenizer_config.json"
    cfg = _read_json(cfg_file) if cfg_file.is_file() else {}

    def token_id(key: str) -> int | None:
        content = _token_content(cfg.get(key))
        if content is None:
            return None
        tid = backend.token_to_id(content)
        if tid is None:
            raise ModelLoadError(f"{cfg_file}: {key} {content!r} is not in tokenizer.json")
        return tid

    bos, eos = token_id("bos_token"), token_id("eos_token")
    if cfg.get("add_bos_token") is not None:
        add_bos = flag(str(cfg_file), "add_bos_token", cfg["add_bos_token"])
    else:
        # No explicit flag: the tokenizer's own post-processor shows whether it adds BOS.
        probe = backend.encode("a", add_special_tokens=True).ids
        add_bos = bos is not None and bool(probe) and probe[0] == bos
    extra_stops: list[int] = []
    gen_file = directory / "generation_config.json"
    if gen_file.is_file():
        extra_stops = _stop_ids(_read_json(gen_file).get("eos_token_id"), gen_file,
                                backend.get_vocab_size(with_added_tokens=True))
    data = json.loads(backend.to_str())
    byte_level = "ByteLevel" in json.dumps(data.get("decoder"))
    return _make(directory, backend, bos=bos, eos=eos, add_bos=add_bos,
                 template=_pick_template(cfg.get("chat_template"), cfg_file),
                 byte_level=byte_level, extra_stops=extra_stops)


def _make(source: Path, backend: HFTokenizer, *, bos: int | None, eos: int | None,
          add_bos: bool, template: str | None, byte_level: bool,
          extra_stops: list[int] | None = None) -> Tokenizer:
    try:
        return Tokenizer(backend, bos_token_id=bos, eos_token_id=eos, add_bos=add_bos,
                         chat_template=template, extra_stop_ids=extra_stops or (),
                         byte_level=byte_level, source=str(source))
    except ValueError as exc:
        raise ModelLoadError(f"{source}: {exc}") from exc
    except jinja2.TemplateError as exc:  # the template is compiled at load time
        raise ModelLoadError(f"{source}: chat template does not compile: {exc}") from exc
