"""llama.cpp's own sampler chain, through llama-cpp-python's C API, for comparisons with
``llmlab.llama.sampling``: the chain ``common_sampler_init`` builds from the same
:class:`~llmlab.llama.sampling.SamplingParams`, applied to a row of logits (no model needed)."""
from __future__ import annotations

import ctypes

import numpy as np

from ..llama.sampling import SamplingParams, TokenDataArray
from ._lib import llama_cpp
from .worker import open_remote


class LlamaCppChain:
    """A ``llama_sampler_chain`` of llama.cpp's samplers in ``params.samplers`` order, then ``dist``, kept in
    llmlab's llama.cpp worker process (:mod:`~llmlab.llamacpp.worker`); the methods are :class:`Chain`'s."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        self._remote = open_remote(Chain, params, n_vocab)

    def apply(self, logits) -> TokenDataArray:
        return self._remote.apply(np.asarray(logits, np.float32).reshape(-1))

    def accept(self, token: int) -> None:
        self._remote.accept(int(token))

    def sample(self, logits) -> int:
        return self._remote.sample(np.asarray(logits, np.float32).reshape(-1))

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
            self._remote = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Chain:
    """The chain itself, in this process."""
    _chain = None

    def __init__(self, params: SamplingParams, n_vocab: int):
        L = self._L = llama_cpp()
        p = params
        make = {"penalties": lambda: L.llama_sampler_init_penalties(n_vocab, p.penalty_last_n, p.penalty_repeat,
                                                                    p.penalty_freq, p.penalty_present),
                "top_k": lambda: L.llama_sampler_init_top_k(p.top_k),
                "typ_p": lambda: L.llama_sampler_init_typical(p.typ_p, p.min_keep),
                "top_p": lambda: L.llama_sampler_init_top_p(p.top_p, p.min_keep),
                "min_p": lambda: L.llama_sampler_init_min_p(p.min_p, p.min_keep),
                "temperature": lambda: L.llama_sampler_init_temp_ext(p.temp, 0.0, 1.0)}
        self._chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        for name in p.samplers:
            L.llama_sampler_chain_add(self._chain, make[name]())
        L.llama_sampler_chain_add(self._chain, L.llama_sampler_init_dist(p.seed))

    def apply(self, logits) -> TokenDataArray:
        """``llama_sampler_apply`` on all tokens as candidates; the candidates it leaves."""
        logits = np.asarray(logits, np.float32).reshape(-1)
        n = len(logits)
        arr = (self._L.llama_token_data * n)()
        raw = np.ctypeslib.as_array(ctypes.cast(arr, ctypes.POINTER(ctypes.c_float)), (n, 3))   # id, logit, p
        raw[:, 0] = np.arange(n, dtype=np.int32).view(np.float32)
        raw[:, 1], raw[:, 2] = logits, 0.0
        cur = self._L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
        self._L.llama_sampler_apply(self._chain, ctypes.byref(cur))
        k = cur.size
        return TokenDataArray(raw[:k, 0].copy().view(np.int32), raw[:k, 1].copy(), raw[:k, 2].copy(),
                              bool(cur.sorted), int(cur.selected))

    def accept(self, token: int) -> None:
        self._L.llama_sampler_accept(self._chain, int(token))

    def sample(self, logits) -> int:
        """Apply, then accept the selected token (``llama_sampler_sample``)."""
        token = self.apply(logits).token
        self.accept(token)
        return token

    def close(self) -> None:
        if self._chain is not None:
            self._L.llama_sampler_free(self._chain)
            self._chain = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
