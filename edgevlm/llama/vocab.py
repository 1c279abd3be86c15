"""Tokens and text through a model's vocabulary, and the vocabulary loaded alone."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from edgevlm.errors import ModelError
from edgevlm.llama.logs import NATIVE_LOG


def tokenize(vocab: llama_cpp.llama_vocab_p, text: str, *, add_bos: bool) -> list[int]:
    """Text to token ids; special tokens written in the text (e.g. <|im_start|>) are parsed.
    add_bos puts the vocabulary's BOS first even where the GGUF says not to add one: a prompt
    format asks for it because the model's template writes it (SmolLM2's BOS is <|im_start|>, its
    GGUF says add_bos false, and its template opens with it; llama.cpp's own add flag dropped that
    first token, which stage 2 of parity found against transformers' ids)."""
    data = text.encode("utf-8")
    capacity = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, capacity, add_bos, True)
        if n >= 0:
            ids = list(buf[:n])
            break
        capacity = -n
    bos = llama_cpp.llama_vocab_bos(vocab)
    if add_bos and bos >= 0 and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def token_bytes(vocab: llama_cpp.llama_vocab_p, token: int) -> bytes:
    """The raw bytes of one token's text (special tokens render as nothing)."""
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    return buf.raw[:n]


def is_end_of_generation(vocab: llama_cpp.llama_vocab_p, token: int) -> bool:
    """Whether the token ends a turn (EOS, EOT and the model's other end tokens)."""
    return bool(llama_cpp.llama_vocab_is_eog(vocab, token))


class Vocab:
    """A model's tokenizer alone (llama.cpp's vocab-only load: no weights, milliseconds)."""

    def __init__(self, model_path: Path) -> None:
        NATIVE_LOG.install()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise ModelError(f"{model_path}: llama.cpp could not read its vocabulary "
                             f"({NATIVE_LOG.error_hint()})")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Text to token ids, exactly as a loaded engine tokenizes it."""
        return tokenize(self._vocab, text, add_bos=add_bos)

    def close(self) -> None:
        """Free the vocabulary (idempotent)."""
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
