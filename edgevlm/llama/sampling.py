"""Picking the next token: the request's sampler chain, and its grammar when it has one."""

from __future__ import annotations

import ctypes
import math

import llama_cpp
import numpy as np

from edgevlm.errors import EngineError
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.values.sampling import Sampling


class TokenPicker:
    """Sampling from a logits row with the request's chain. Under a grammar it works the way
    llama.cpp's common sampler does: the chain picks from the raw logits, and only when the
    grammar rejects that token is the grammar applied to the whole vocabulary (costly) before
    the chain picks again."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, n_vocab: int, sampling: Sampling) -> None:
        self._n_vocab = n_vocab
        self._chain = _make_chain(vocab, n_vocab, sampling)
        self._grammar = _make_grammar(vocab, sampling.grammar, self._chain)
        cell = [("id", np.int32), ("logit", np.float32), ("p", np.float32)]  # llama_token_data's layout
        self._cells = np.zeros(n_vocab, dtype=cell)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._one = llama_cpp.llama_token_data()
        self._one_array = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(self._one), size=1, selected=-1, sorted=False)

    def pick(self, logits: np.ndarray) -> int:
        """The next token, accepted by the grammar (if any) and the chain."""
        token = self._pick(logits, with_grammar=False)
        if self._grammar is not None:
            if not self._allowed(token):
                token = self._pick(logits, with_grammar=True)
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        """Free the samplers."""
        llama_cpp.llama_sampler_free(self._chain)
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)

    def _pick(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        self._cells["id"] = self._ids
        self._cells["logit"] = logits
        self._cells["p"] = 0.0
        data = self._cells.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        candidates = llama_cpp.llama_token_data_array(data=data, size=self._n_vocab, selected=-1,
                                                      sorted=False)
        if with_grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        return int(candidates.data[candidates.selected].id)

    def _allowed(self, token: int) -> bool:
        self._one.id, self._one.logit, self._one.p = token, 1.0, 0.0  # type: ignore[assignment]  # ctypes converts an int field
        self._one_array.size, self._one_array.selected = 1, -1
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._one_array))
        return math.isfinite(self._one.logit)


def _make_grammar(vocab: llama_cpp.llama_vocab_p, gbnf: str | None,
                  chain: ctypes.c_void_p) -> ctypes.c_void_p | None:
    """The grammar sampler for constrained output (kept apart from the chain: see TokenPicker)."""
    if not gbnf:
        return None
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not grammar:
        llama_cpp.llama_sampler_free(chain)
        raise EngineError(f"llama.cpp could not parse the output grammar ({NATIVE_LOG.error_hint()})")
    return grammar


def _make_chain(vocab: llama_cpp.llama_vocab_p, n_vocab: int, s: Sampling) -> ctypes.c_void_p:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    add(chain, llama_cpp.llama_sampler_init_top_k(max(s.top_k, 1)))
    if s.repeat_penalty != 1.0 or s.frequency_penalty or s.presence_penalty:
        add(chain, llama_cpp.llama_sampler_init_penalties(
            n_vocab, s.repeat_last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))
    if s.temperature <= 0:
        add(chain, llama_cpp.llama_sampler_init_greedy())
    else:
        add(chain, llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
        add(chain, llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
        add(chain, llama_cpp.llama_sampler_init_temp(s.temperature))
        add(chain, llama_cpp.llama_sampler_init_dist(s.seed & 0xFFFFFFFF))
    return chain
