"""Where the weights live: llama.cpp's ``n_gpu_layers`` rule (llama_model::load_tensors).

- the input layer (token_embd for get_rows) always stays on the CPU;
- the model has ``n_layer + 1`` layer slots: the repeating blocks 0 .. n_layer-1, then the output layer
  (output_norm, output) as slot n_layer;
- the *last* ``n_gpu_layers`` slots are offloaded (``i_gpu_start = n_layer + 1 - n_gpu_layers``): with
  ``n_gpu_layers = 1`` only the output layer, with ``n_layer + 1`` everything;
- with several devices, device i takes the offloaded slots whose fraction of them falls below the i-th
  cumulative, normalised ``tensor_split`` (one device: ``[1]``);
- a layer's KV cache sits with the layer.
"""
from __future__ import annotations

import bisect


def layer_devices(n_layer: int, n_gpu_layers: int, tensor_split: list[float]) -> list[int | None]:
    """llama.cpp's get_layer_buft_list for slots 0..n_layer (n_layer: the output layer): the device index of
    each slot, None for the CPU. ``tensor_split``: one weight per device (llama.cpp normalises them)."""
    total = float(sum(tensor_split))
    if not tensor_split or total <= 0 or any(x < 0 for x in tensor_split):
        raise ValueError(f"tensor split {tensor_split} needs one non-negative weight per device, not all zero")
    splits, acc = [], 0.0
    for x in tensor_split:
        acc += x
        splits.append(acc / total)
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(None)
        else:
            out.append(min(bisect.bisect_right(splits, (il - i_gpu_start) / act), len(splits) - 1))
    return out


def placed_tensors(model, kv):
    """(tensor, layer slot, is a weight) for every weight and KV tensor: the input layer is slot -1."""
    hp = model.hparams
    yield model.tok_embd, -1, True
    for t in (model.output_norm, model.output, getattr(model, "output_b", None)):   # the output layer
        if t is not None:
            yield t, hp.n_layer, True
    for il, L in enumerate(model.layers):
        for t in vars(L).values():
            if t is not None:
                yield t, il, True
    if kv is not None:
        for il in range(hp.n_layer):
            yield kv.k_l[il], il, False
            if kv.v_l[il] is not None:         # an MLA cache has K rows only
                yield kv.v_l[il], il, False


def place_model(model, kv, n_gpu_layers: int, backends, tensor_split=None) -> tuple[dict[int, str], set[int]]:
    cpu = backends[-1].buffer_type
    hp = model.hparams
    n_devices = len(backends) - 1
    if tensor_split is None:
        tensor_split = [1.0] * n_devices
    if len(tensor_split) != n_devices:
        raise ValueError(f"tensor split has {len(tensor_split)} values for {n_devices} devices")
    slots = layer_devices(hp.n_layer, n_gpu_layers if n_devices else 0, tensor_split or [1.0])
    device = [cpu if d is None else backends[d].buffer_type for d in slots]
    buffers: dict[int, str] = {}
    weights: set[int] = set()
    for t, il, weight in placed_tensors(model, kv):
        buffers[id(t)] = cpu if il < 0 else device[il]
        if weight:
            weights.add(id(t))
    return buffers, weights
