"""Per-op yardstick for decode's quantized mat-vec products: llmlab's fast kernels against llama.cpp's own
ggml on the same weights, shapes, types and thread count.

One decode token's products are replayed kind by kind (all layers' ``attn_q``, then all ``ffn_gate``,
..., the output head), each by one activation row; a pass streams every weight once, more than the
caches hold, so the weights come from memory as in a decode step. llmlab runs each product through
``fast.dispatch.bind_step`` (what a plan step runs); ggml, through ctypes on llama-cpp-python's shared
libraries, one graph per kind of the layers' MUL_MATs (a barrier between nodes, as in a decode graph),
computed by the CPU backend and its persistent threadpool, the weights in the CPU_REPACK buffer where
llama.cpp puts them (q4_K on AVX2). Each side runs its passes in a block of its own (the other's
threads asleep). Prints, per weight
kind, the median microseconds per layer of each side and their ratio (> 1: llmlab slower), and whether
the results are the same bits. A benchmark, not a test; the machine is shared, read the load average.

    python benchmarks/bench_matvec_vs_ggml.py [-m gemma3] [-t 2 1] [--rounds 15] [--only ffn_gate,output]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import time

import numpy as np

from llmlab import models
from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu.fast import dispatch, set_threads
from llmlab.ggml.gguf.reader import GGUFFile

GGML_TYPE_F32 = 0


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class GGML:
    """The few ggml entry points the yardstick calls, from llama-cpp-python's bundled libraries."""

    def __init__(self):
        import llama_cpp
        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        self.base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        P = ctypes.c_void_p
        self._sig(self.base, "ggml_init", P, [_InitParams])
        self._sig(self.base, "ggml_free", None, [P])
        self._sig(self.base, "ggml_new_tensor_2d", P, [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
        self._sig(self.base, "ggml_mul_mat", P, [P, P, P])
        self._sig(self.base, "ggml_new_graph", P, [P])
        self._sig(self.base, "ggml_build_forward_expand", None, [P, P])
        self._sig(self.base, "ggml_backend_alloc_ctx_tensors_from_buft", P, [P, P])
        self._sig(self.base, "ggml_backend_buffer_free", None, [P])
        self._sig(self.base, "ggml_backend_cpu_buffer_type", P, [])
        self._sig(self.base, "ggml_backend_buft_name", ctypes.c_char_p, [P])
        self._sig(self.base, "ggml_backend_tensor_set", None, [P, P, ctypes.c_size_t, ctypes.c_size_t])
        self._sig(self.base, "ggml_backend_tensor_get", None, [P, P, ctypes.c_size_t, ctypes.c_size_t])
        self._sig(self.base, "ggml_backend_graph_compute", ctypes.c_int, [P, P])
        self._sig(self.base, "ggml_backend_free", None, [P])
        self._sig(self.cpu, "ggml_backend_cpu_init", P, [])
        self._sig(self.cpu, "ggml_backend_cpu_set_n_threads", None, [P, ctypes.c_int])
        self._sig(self.cpu, "_Z35ggml_backend_cpu_repack_buffer_typev", P, [])   # C++ linkage in ggml-cpu

    @staticmethod
    def _sig(lib, name, res, args):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args

    def __getattr__(self, name):
        for lib in (self.base, self.cpu):
            if hasattr(lib, name):
                return getattr(lib, name)
        raise AttributeError(name)

    def repack_buft(self):
        return self.cpu._Z35ggml_backend_cpu_repack_buffer_typev()


class GGMLMatvec:
    """out_l = W_l x for a list of weights of one type and shape, one graph of their MUL_MATs (as a decode
    graph runs them: a barrier between nodes), on ggml's CPU backend."""

    def __init__(self, g: GGML, raws: list, type_id: int, K: int, R: int, repacked: bool, n_threads: int):
        self.g = g
        n = len(raws)
        self.wctx = g.ggml_init(_InitParams(1 << 20, None, True))
        self.actx = g.ggml_init(_InitParams(1 << 24, None, True))
        W = [g.ggml_new_tensor_2d(self.wctx, type_id, K, R) for _ in range(n)]
        self.x = g.ggml_new_tensor_2d(self.actx, GGML_TYPE_F32, K, 1)
        self.y = [g.ggml_mul_mat(self.actx, w, self.x) for w in W]
        self.graph = g.ggml_new_graph(self.actx)          # one graph: the products one after another
        for y in self.y:
            g.ggml_build_forward_expand(self.graph, y)
        self.buft = g.repack_buft() if repacked else g.ggml_backend_cpu_buffer_type()
        self.wbuf = g.ggml_backend_alloc_ctx_tensors_from_buft(self.wctx, self.buft)
        self.abuf = g.ggml_backend_alloc_ctx_tensors_from_buft(self.actx, g.ggml_backend_cpu_buffer_type())
        for w, raw in zip(W, raws):
            raw = np.ascontiguousarray(raw)
            g.ggml_backend_tensor_set(w, raw.ctypes.data, 0, raw.nbytes)
        self.backend = g.ggml_backend_cpu_init()
        g.ggml_backend_cpu_set_n_threads(self.backend, n_threads)
        self.R = R

    def set_x(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, np.float32)
        self.g.ggml_backend_tensor_set(self.x, x.ctypes.data, 0, x.nbytes)

    def run(self) -> None:
        self.g.ggml_backend_graph_compute(self.backend, self.graph)

    def result(self, i: int) -> np.ndarray:
        out = np.empty(self.R, np.float32)
        self.g.ggml_backend_tensor_get(self.y[i], out.ctypes.data, 0, out.nbytes)
        return out

    def close(self) -> None:
        g = self.g
        g.ggml_backend_free(self.backend)
        g.ggml_backend_buffer_free(self.wbuf)
        g.ggml_backend_buffer_free(self.abuf)
        g.ggml_free(self.actx)
        g.ggml_free(self.wctx)


def decode_weights(f: GGUFFile) -> dict:
    """The 2-D quantized weights a decode step multiplies, by kind ((kind, type, K, R) -> every layer's raw
    rows; the output head: output.weight, else the tied token_embd)."""
    kinds: dict = {}
    names = {t.name for t in f.tensors}
    for t in f.tensors:
        if len(t.shape) != 2 or not t.type.is_quantized:
            continue
        m = re.match(r"blk\.\d+\.(.+)\.weight$", t.name)
        if m:
            kind = m.group(1)
        elif t.name == "output.weight" or (t.name == "token_embd.weight" and "output.weight" not in names):
            kind = "output"
        else:
            continue
        K, R = t.shape
        kinds.setdefault((kind, t.type, K, R), []).append(t.data.reshape(R, -1))
    return kinds


def time_rounds(runs: list, rounds: int, stat=statistics.median) -> list:
    """Microseconds of each run(), ``stat`` (median, min) over ``rounds`` passes over all of them (a first
    not counted)."""
    ts = [[] for _ in runs]
    for rep in range(rounds + 1):
        for i, run in enumerate(runs):
            a = time.perf_counter()
            run()
            if rep:
                ts[i].append(time.perf_counter() - a)
    return [stat(t) * 1e6 for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3")
    ap.add_argument("-t", "--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--rounds", type=int, default=15, help="passes over one token's products")
    ap.add_argument("--min", action="store_true", help="the fastest pass, not the median (a busy machine's "
                    "interruptions left out)")
    ap.add_argument("--only", default=None, help="comma-separated weight kinds (attn_q,ffn_gate,output,...)")
    args = ap.parse_args()
    if hasattr(os, "getloadavg"):
        print("load average %.2f %.2f %.2f" % os.getloadavg())
    path = models.resolve(args.model)
    f = GGUFFile(path)
    cpu = profiles.resolve(None)
    g = GGML()
    kinds = decode_weights(f)
    if args.only:
        kinds = {k: v for k, v in kinds.items() if k[0] in set(args.only.split(","))}
    rng = np.random.default_rng(0)
    xs = {K: rng.standard_normal((1, K)).astype(np.float32) for _, _, K, _ in kinds}
    for n in args.threads:
        set_threads(n)
        ours, gms, outs = [], [], []
        for (_kind, qt, K, R), raws in kinds.items():
            rep = cpu.repacks(qt.name, R)
            ys = [np.empty((1, R), np.float32) for _ in raws]
            steps = [dispatch.bind_step(raw, qt, xs[K], y, rep, cpu) for raw, y in zip(raws, ys)]
            ours.append(lambda steps=steps: [s() for s in steps])
            gm = GGMLMatvec(g, raws, qt.id, K, R, rep, n)
            gm.set_x(xs[K])
            gms.append(gm)
            outs.append(ys)
        stat = min if args.min else statistics.median
        t_ours = time_rounds(ours, args.rounds, stat)
        time.sleep(0.5)                          # the other side's threads asleep again
        t_theirs = time_rounds([gm.run for gm in gms], args.rounds, stat)
        time.sleep(0.5)
        same = all(np.array_equal(y[0], gm.result(i)) for ys, gm in zip(outs, gms) for i, y in enumerate(ys))
        for gm in gms:
            gm.close()
        print(f"\n{n} thread(s), {'min' if args.min else 'median'} of {args.rounds}; bits equal: {same}")
        print(f"{'weight':<14}{'type':<6}{'K x R':>14}{'layers':>7}{'llmlab us':>11}{'ggml us':>9}{'ratio':>7}  (per layer)")
        for ((kind, qt, K, R), raws), a, b in zip(kinds.items(), t_ours, t_theirs):
            c = len(raws)
            print(f"{kind:<14}{qt.name:<6}{f'{K}x{R}':>14}{c:>7}{a / c:>11.1f}{b / c:>9.1f}{a / b:>7.2f}")
        A, B = sum(t_ours), sum(t_theirs)
        print(f"one token's products: llmlab {A / 1e3:.2f} ms, ggml {B / 1e3:.2f} ms, ratio {A / B:.2f}")
    set_threads(None)


if __name__ == "__main__":
    main()
