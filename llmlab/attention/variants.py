"""MHA, GQA, MQA and MLA as what they cost in the KV cache.

Per token and per layer the cache holds:

- MHA (multi-head): a K and a V row for every head: ``n_head * (d_k + d_v)`` numbers;
- GQA (grouped-query): query heads share ``n_head_kv`` K/V heads: ``n_head_kv * (d_k + d_v)``;
- MQA (multi-query): all query heads share one: ``d_k + d_v`` (GQA with ``n_head_kv = 1``);
- MLA (multi-head latent, DeepSeek-V2): one compressed latent ``c_kv`` of ``d_c`` numbers, plus the small
  decoupled RoPE key of ``d_rope`` numbers; K and V are re-expanded from ``c_kv`` by up-projections.

Cache bytes = n_ctx x n_layer x (numbers per token per layer) x bytes per number, which for the first
three is llama.cpp's n_ctx x n_layer x 2 x n_embd_gqa x sizeof(type) when d_k = d_v.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttnShape:
    name: str
    n_layer: int
    n_head: int
    n_head_kv: int
    d_k: int
    d_v: int
    d_c: int = 0            # MLA: latent width (kv_lora_rank)
    d_rope: int = 0         # MLA: decoupled RoPE key width
    source: str = ""

    @property
    def kind(self) -> str:
        if self.d_c:
            return "MLA"
        if self.n_head_kv == self.n_head:
            return "MHA"
        return "MQA" if self.n_head_kv == 1 else "GQA"

    @property
    def per_token_layer(self) -> int:
        """Numbers cached per token per layer (K and V together)."""
        if self.d_c:
            return self.d_c + self.d_rope
        return self.n_head_kv * (self.d_k + self.d_v)

    @property
    def mha_per_token_layer(self) -> int:
        """What the same heads would cache with full multi-head attention."""
        return self.n_head * (self.d_k + self.d_v)

    @property
    def saving(self) -> float:
        return self.mha_per_token_layer / self.per_token_layer

    def kv_bytes(self, n_ctx: int, bytes_per_number: float = 2.0) -> float:
        return n_ctx * self.n_layer * self.per_token_layer * bytes_per_number

    def with_kv_heads(self, n_head_kv: int, name: str | None = None) -> "AttnShape":
        """The same model with another number of KV heads (n_head: MHA, 1: MQA)."""
        if n_head_kv <= 0 or self.n_head % n_head_kv:
            raise ValueError(f"{self.name}: {self.n_head} heads cannot be shared by {n_head_kv} KV heads")
        return AttnShape(name or f"{self.name} as {n_head_kv} KV heads", self.n_layer, self.n_head, n_head_kv,
                         self.d_k, self.d_v, source="what-if")


def shape_of(name: str, hp) -> AttnShape:
    """The attention shape of a loaded model's hparams (``llmlab.llama.HParams``)."""
    return AttnShape(name, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_embd_head_k, hp.n_embd_head_v,
                     source="GGUF hparams")


# The models the seed article quotes, with their published configurations.
SEED_MODELS = {
    # LLaMA-7B: n_embd 4096, 32 layers, 32 heads of 128, full MHA (the seed's KV table: 1.0 GB at 2048)
    "LLaMA-7B": AttnShape("LLaMA-7B", 32, 32, 32, 128, 128, source="seed / LLaMA paper"),
    # LLaMA-2-70B: n_embd 8192, 80 layers, 64 heads of 128 sharing 8 KV heads (n_embd_gqa = 1024)
    "LLaMA-2-70B": AttnShape("LLaMA-2-70B", 80, 64, 8, 128, 128, source="seed / LLaMA 2 paper"),
    # DeepSeek-V2: 60 layers, 128 heads of 128 (+64 RoPE dims), latent kv_lora_rank = 512
    "DeepSeek-V2": AttnShape("DeepSeek-V2", 60, 128, 128, 128, 128, d_c=512, d_rope=64,
                             source="seed / DeepSeek-V2 config"),
}


def kv_table(shapes, n_ctx: int = 4096, bytes_per_number: float = 2.0) -> list[dict]:
    """One row per shape: kind, heads, numbers cached per token per layer, cache size at ``n_ctx``, saving."""
    rows = []
    for s in shapes:
        rows.append({"model": s.name, "kind": s.kind, "n_layer": s.n_layer, "n_head": s.n_head,
                     "n_head_kv": s.n_head_kv if not s.d_c else "-", "d_k": s.d_k,
                     "per token/layer": s.per_token_layer,
                     f"KV @ {n_ctx} (MiB)": round(s.kv_bytes(n_ctx, bytes_per_number) / 2**20, 1),
                     "vs MHA": f"{s.saving:.1f}x"})
    return rows


# ---- MLA as llama.cpp runs it: the absorbed form's cache row --------------------------------------------

@dataclass(frozen=True)
class MLAShape:
    """A DeepSeek-style attention: per head a query/key of ``d_nope + d_rope`` and a value of ``d_v``; the
    cache keeps per token and layer one latent of ``d_c`` (kv_lora_rank) plus the shared RoPE key."""
    name: str
    n_layer: int
    n_head: int
    d_nope: int
    d_rope: int
    d_v: int
    d_c: int
    q_lora: int = 0
    source: str = ""

    @property
    def d_k(self) -> int:
        return self.d_nope + self.d_rope

    def per_token_layer(self, kind: str = "MLA", n_head_kv: int | None = None) -> int:
        """Numbers cached per token and layer: "MHA" (every head's K and V), "GQA" (``n_head_kv`` shared
        K/V heads of the same sizes), "MLA" (llama.cpp's absorbed row: latent + RoPE key, no V)."""
        if kind == "MLA":
            return self.d_c + self.d_rope
        n = self.n_head if kind == "MHA" else (n_head_kv or 8)
        return n * (self.d_k + self.d_v)

    def bytes_per_token_layer(self, kind: str = "MLA", n_head_kv: int | None = None, bytes_per_number: float = 2.0) -> float:
        return self.per_token_layer(kind, n_head_kv) * bytes_per_number


def mla_shape_of(name: str, hp) -> MLAShape:
    """The MLA shape of a loaded deepseek2 model's hparams (llama.cpp's n_lora_kv, n_rot, *_mla sizes)."""
    return MLAShape(name, hp.n_layer, hp.n_head, hp.n_embd_head_k_mla - hp.n_rot, hp.n_rot, hp.n_embd_head_v_mla,
                    hp.n_lora_kv, hp.n_lora_q, source="GGUF hparams")


# published configurations (config.json: num_hidden_layers, num_attention_heads, qk_nope_head_dim,
# qk_rope_head_dim, v_head_dim, kv_lora_rank, q_lora_rank)
PUBLISHED_MLA = {
    "DeepSeek-V2": MLAShape("DeepSeek-V2", 60, 128, 128, 64, 128, 512, 1536, "DeepSeek-V2 config.json"),
    "DeepSeek-V2-Lite": MLAShape("DeepSeek-V2-Lite", 27, 16, 128, 64, 128, 512, 0, "DeepSeek-V2-Lite config.json"),
    "DeepSeek-V3": MLAShape("DeepSeek-V3", 61, 128, 128, 64, 128, 512, 1536, "DeepSeek-V3 config.json"),
    "Kimi K2": MLAShape("Kimi K2", 61, 64, 128, 64, 128, 512, 1536, "Kimi-K2 config.json"),
}
