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


def load_gguf_tokenizer(path: Path, reader: Any = None) -> Tokenizer:
    if reader is None:
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such GGUF file")
        import gguf

        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:
            raise ModelLoadError(f"{path}: not a readable GGUF file: {exc}") from exc
    kind = _field(reader, _KEY + "model", path)
    if kind != "gpt2":
        raise ModelLoadError(f"{path}: tokenizer model {kind!r} is not supported "
                             "(only byte-level BPE, tokenizer.ggml.model = 'gpt2')")
    tokens = _field(reader, _KEY + "tokens", path)
    merges = _field(reader, _KEY + "merges", path)
    types = _field(reader, _KEY + "token_type", path, required=False)
    # GGUFs written before the key existed use the GPT-2 split (llama.cpp's "default").
    pre = _field(reader, _KEY + "pre", path, required=False) or "default"
    try:
        backend = build_byte_level_bpe(tokens, merges, types, pre)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: bad tokenizer metadata: {exc}") from exc

    def token_id(name: str) -> int | None:
        value = _field(reader, f"{_KEY}{name}_token_id", path, required=False)
        if value is None:
            return None
        if not 0 <= int(value) < len(tokens):
            raise ModelLoadError(f"{path}: {_KEY}{name}_token_id = {value} is outside the "
                                 f"vocabulary of {len(tokens)} tokens")
        return int(value)

    template = _field(reader, "tokenizer.chat_template", path, required=False)
    add_bos = _field(reader, _KEY + "add_bos_token", path, required=False)
    return _make(path, backend, bos=token_id("bos"), eos=token_id("eos"),
                 add_bos=bool(add_bos), template=template, byte_level=True)


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes tokens either as "<s>" or as {"content": "<s>", ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any) -> str | None:
    # Newer configs may hold a list of named templates; "default" is the chat one.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


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
    if "add_bos_token" in cfg:
        add_bos = bool(cfg["add_bos_token"])
    else:
        # No explicit flag: the tokenizer's own post-processor shows whether it adds BOS.
        probe = backend.encode("a", add_special_tokens=True).ids
        add_bos = bos is not None and bool(probe) and probe[0] == bos
    extra_stops: list[int] = []
    gen_file = directory / "generation_config.json"
    if gen_file.is_file():
        gen_eos = _read_json(gen_file).get("eos_token_id")
        extra_stops = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
    data = json.loads(backend.to_str())
    byte_level = "ByteLevel" in json.dumps(data.get("decoder"))
    return _make(directory, backend, bos=bos, eos=eos, add_bos=add_bos,
                 template=_pick_template(cfg.get("chat_template")), byte_level=byte_level,
                 extra_stops=[int(t) for t in extra_stops])


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
