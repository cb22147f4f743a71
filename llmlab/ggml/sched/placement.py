"""Where the weights live: llama.cpp's ``n_gpu_layers`` rule (llama_model::load_tensors).

- the input layer (token_embd for get_rows) always stays on the CPU;
- repeating layers 0 .. n_gpu_layers-1 go to the accelerator, the rest stay on the CPU;
- the output layer (output_norm, output) follows: on the accelerator only when
  n_gpu_layers > n_layer (so ``n_layer + 1`` offloads everything);
- a layer's KV cache sits with the layer.
"""
from __future__ import annotations

from ..tensor import Tensor


def layer_device(il: int, n_gpu_layers: int, n_layer: int) -> bool:
    """True when layer ``il`` (n_layer: the output layer) is offloaded."""
    if il == n_layer:
        return n_gpu_layers > n_layer
    return il < n_gpu_layers


def place_model(model, kv, n_gpu_layers: int, backends) -> tuple[dict[int, str], set[int]]:
    accel = backends[0].buffer_type if len(backends) > 1 else None
    cpu = backends[-1].buffer_type
    hp = model.hparams
    buffers: dict[int, str] = {}
    weights: set[int] = set()

    def put(t: Tensor, il: int, weight: bool = True):
        buffers[id(t)] = accel if (accel and layer_device(il, n_gpu_layers, hp.n_layer)) else cpu
        if weight:
            weights.add(id(t))

    buffers[id(model.tok_embd)] = cpu
    weights.add(id(model.tok_embd))
    for t in (model.output_norm, model.output, getattr(model, "output_b", None)):   # the output layer
        if t is not None:
            put(t, hp.n_layer)
    for il, L in enumerate(model.layers):
        for t in vars(L).values():
            if t is not None:
                put(t, il)
    if kv is not None:
        for il in range(hp.n_layer):
            put(kv.k_l[il], il, weight=False)
            put(kv.v_l[il], il, weight=False)
    return buffers, weights
