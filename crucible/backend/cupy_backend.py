"""The CuPy backend: the same forward on our own CUDA kernels (cuda/*.cu), each in a
canonical order that does not depend on the batch (cuda/linear.cu and linear_mma.cu for the
GEMMs, cuda/model_ops.cu for the row kernels, cuda/attention.cu for attention). No cuBLAS,
no CuPy generic reductions on this path. Step metadata goes up in one bulk copy; only the
final rows' logits come back. Weights live on the device (kernels/device_weight.py); the
bindings are crucible/kernels (a wrapper per .cu); a launch that can use PDL gets options.pdl.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from crucible.backend import cupy_fork, cupy_mma, cupy_prebuild, cupy_rope_in, cupy_route
from crucible.backend import cupy_stack, stages
from crucible.backend.cupy_graph_memory import logits_out
from crucible.backend.cupy_memory import MemoryGuard, step_headroom
from crucible.backend.cupy_meta import CupyMeta, device_meta
from crucible.backend.options import BackendOptions
from crucible.backend.protocol import BackendWeights, Forward, Geometry
from crucible.backend.rope import rope_table
from crucible.kernels import linear as ck
from crucible.kernels import linear_chunks as cc
from crucible.kernels import linear_mma as lm, linear_wgmma
from crucible.kernels import linear_rows as cf
from crucible.kernels.device_weight import DeviceWeight, cupy, upload_weight
from crucible.kernels.model_ops import flat_launch, rows_launch
from crucible.kernels.variants import Variant, parse_variant, require_cuda_geometry
from crucible.step.batch import PackedBatch


class CupyBackend:
    name = "cupy"
    device = "cuda"

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.variant: Variant = parse_variant(self.options.attention)
        self.use_stack = self.options.decode_stack  # kernels/decode_stack.py (both orders)
        self.wgmma = self.options.wgmma if self.mma else False  # None: auto, at load_weights
        self.cfg: Geometry | None = None
        # Once the pool exists: DecodeGraphs, PrefillGraphs, MixedGraphs (None where off)
        # and the bound on their memory (cupy_memory.py).
        self.graphs = self.prefill_graphs = self.mixed_graphs = self.memory = None
        self._linear: dict[str, DeviceWeight] = {}
        self._norms: dict[str, Any] = {}

    @property
    def mma(self) -> bool:
        """gemm "mma": every int8 GEMM in linear_mma.cu's order (cupy_mma.py's fused forms)."""
        return self.options.gemm == "mma"

    @property
    def arithmetic(self) -> str:  # linear_wgmma gives mma's bits (bench/wgmma-*-h200): no suffix
        return f"cupy-{self.variant.name}" + ("-mma" if self.mma else "")

    def load_weights(self, geometry: Geometry, weights: BackendWeights) -> None:
        require_cuda_geometry(geometry)
        cupy_prebuild.start(self.options).wait()  # every module built before its first use
        cp = cupy()
        cfg = self.cfg = geometry
        self.mode = weights.mode
        self.embedding = cp.asarray(weights.embedding)
        cos, sin = rope_table(cfg.max_context, cfg.head_dim, cfg.rope_theta)
        self._cos, self._sin = cp.asarray(cos), cp.asarray(sin)
        if self.wgmma is not False:
            self.wgmma = linear_wgmma.enable(self.wgmma)
        for name, lw in weights.linears.items():  # mma: the codes as bf16 too (its tile GEMM)
            self._linear[name] = upload_weight(lw.w, lw.scale, bf16=self.mma, wgmma=self.wgmma)
        self._norms = {name: cp.asarray(v) for name, v in weights.norms.items()}

    def weight(self, name: str) -> DeviceWeight:
        """The linear weight ``name`` (``l{i}.qkv``, ``lm_head``...) as uploaded."""
        return self._linear[name]

    def norm(self, name: str) -> Any:
        """The RMSNorm weight ``name`` (``l{i}.ffn_norm``, ``final_norm``...) on the device."""
        return self._norms[name]

    def allocate_pool(self, num_pages: int) -> None:
        from crucible.backend.cupy_graphs import DecodeGraphs
        from crucible.backend.cupy_mixed_graphs import MixedGraphs
        from crucible.backend.cupy_prefill_graphs import PrefillGraphs

        cp, cfg = cupy(), self.cfg
        # One scratch page past the engine's pages: graph padding, capture stand-ins write it.
        shape = (num_pages + 1, cfg.n_layers, 16, cfg.kv_dim)
        self.k_pool, self.v_pool = cp.zeros(shape, cp.float32), cp.zeros(shape, cp.float32)
        width = -(-cfg.max_context // 16)
        self.graphs = self.prefill_graphs = self.mixed_graphs = None
        if self.options.decode_graphs:
            self.graphs = DecodeGraphs(cfg.vocab_size, width, num_pages, owner=self)
        if self.options.prefill_graphs:
            self.prefill_graphs = PrefillGraphs(width, num_pages, owner=self)
        if self.options.mixed_graphs:
            self.mixed_graphs = MixedGraphs(table_width=width, scratch_page=num_pages,
                                            max_tokens=self.options.mixed_graph_rows, owner=self)
        self.memory = MemoryGuard.wire(self, step_headroom(cfg, self.options.mixed_graph_rows))

    def memory_info(self) -> tuple[int, int]:
        # A dropped engine's cached blocks go back first: the graphs' pools allocate from
        # the device, not from that cache, so it must not count as free.
        cupy().get_default_memory_pool().free_all_blocks()
        free, total = cupy().cuda.runtime.memGetInfo()
        return int(free), int(total)

    def capture_graphs(self, forward: Forward, max_rows: int) -> int:
        return 0 if self.graphs is None else self.graphs.capture_all(forward, max_rows)

    # Which way steps run and ran (backend/protocol.py), answered by cupy_route.py.
    graph_stats = cupy_route.graph_stats
    first_use = cupy_route.first_use
    mixed_feed_rows = cupy_route.mixed_feed_rows

    def device_sampler(self) -> Any:
        from crucible.backend.cupy_sampling import CupySampler
        return CupySampler()

    def set_variant(self, variant: Any) -> None:
        """Switch the attention variant; drops every graph (it bakes in its kernels)."""
        new = parse_variant(variant) if isinstance(variant, str) else variant
        self._drop_graphs()
        self.variant = new

    def set_pdl(self, on: bool) -> None:
        """Programmatic dependent launch in decode graphs on or off (kernels/launch.py): waits
        for queued work and drops every graph, since a graph bakes in how it launches."""
        self._drop_graphs()
        self.options = dataclasses.replace(self.options, pdl=bool(on))

    def set_decode_stack(self, on: bool) -> None:
        """The batch-1 decode stack on or off (same bits either way); drops every graph."""
        self._drop_graphs()
        self.use_stack = bool(on)

    def decode_stack(self, meta: CupyMeta) -> Any:
        """A batch-1 decode step in three kernels a layer (kernels/decode_stack.py), or None."""
        return cupy_stack.decode_stack(self, meta)

    # The pipelined decode's hand-over of ids (backend/protocol.py), all in the decode graphs.
    def fed_ids(self, rows: int) -> Any:
        return self.graphs.fed_ids(rows) if self.graphs is not None else None

    def sampled_ids(self, rows: int) -> Any:
        g = self.graphs
        buf = g.fed_ids(rows) if g is not None and g.last_replayed else None
        return None if buf is None else buf[:rows]

    def ids_copied(self, event: Any) -> None:
        if self.graphs is not None:
            self.graphs.copied(event)

    def _drop_graphs(self) -> None:
        cupy().cuda.Device().synchronize()
        for g in (self.graphs, self.prefill_graphs, self.mixed_graphs):
            if g is not None:
                g.clear()

    def run_step(self, batch: PackedBatch, forward: Forward,
                 feed: np.ndarray | None = None) -> Any:
        """Logits [R, vocab] of the final rows as a device array (the backend's: valid until
        the next step), from a graph or eagerly: backend/cupy_route.py."""
        return cupy_route.run_step(self, batch, forward, feed)

    def new(self, shape: tuple[int, ...]) -> Any:
        """An uninitialised f32 device array (the stages' outputs)."""
        return cupy().empty(shape, dtype=np.float32)

    def prepare(self, batch: PackedBatch) -> CupyMeta:
        return device_meta(batch)

    def embed(self, meta: CupyMeta) -> Any:
        d = self.cfg.hidden_size
        y = self.new((meta.num_rows, d))
        if meta.feed is not None:
            rows_launch("embed_fed", meta.num_rows, (self.embedding, meta.token_ids,
                                                      meta.feed, meta.fed, y, np.int32(d)),
                        pdl=self.options.pdl)
        else:
            rows_launch("embed_rows", meta.num_rows, (self.embedding, meta.token_ids, y,
                                                       np.int32(d)), pdl=self.options.pdl)
        return y

    def rmsnorm(self, x: Any, weight: str) -> Any:
        y = self.new(x.shape)
        rows_launch("rmsnorm_rows", x.shape[0], (x, self._norms[weight], y,
                                                  np.int32(x.shape[1]),
                                                  np.float32(self.cfg.rms_eps)),
                    pdl=self.options.pdl)
        return y

    def linear(self, x: Any, weight: str) -> Any:
        return self._gemm(x, self._linear[weight], None)

    def linear_add(self, x: Any, weight: str, residual: Any) -> Any:
        return self._gemm(x, self._linear[weight], residual)

    def _gemm(self, x: Any, wd: DeviceWeight, residual: Any, out: Any = None,
              tiled: bool = False) -> Any:
        out = self.new((x.shape[0], wd.shape[0])) if out is None else out
        if self.mma and wd.dtype_name == "int8" and lm.supports(*wd.shape):
            return lm.linear_mma(x, wd, out, residual, pdl=self.options.pdl, wgmma=self.wgmma)
        return ck.linear(x, wd, out, residual=residual, tiled=tiled, pdl=self.options.pdl)

    # -- fused stage groups (stages.py composes the primitives).
    # Small M runs one row kernel per group (cuda/linear_rows.cu); large M runs the
    # primitives. Both spell the arithmetic the same way, so the bits never depend on which.
    def fuses(self, x: Any, group: str) -> bool:
        """Whether ``group`` (attn_in, mlp_in, norm_linear) runs as one row kernel for x."""
        epi = {"attn_in": cf.EPI_ROPE, "mlp_in": cf.EPI_SWIGLU}.get(group, cf.EPI_STORE)
        ok = not self.mma and cf.fuses(x.shape[0], x.shape[1], epi)
        return ok and (group != "attn_in" or self.cfg.head_dim == 64)

    def attn_in(self, x: Any, layer: int, meta: CupyMeta, **combine: Any) -> Any:
        """RMSNorm -> QKV -> RoPE -> K/V into the pool; returns Q [T, H*hd]. ``combine``
        (parts, pscale, x_out: the decode stack) goes to the row kernel's prologue."""
        if not combine and not self.fuses(x, "attn_in"):  # Q, or the raw QKV (cupy_rope_in)
            return cupy_rope_in.attn_in(self, x, layer, meta)
        cfg = self.cfg
        q = self.new((meta.num_rows, cfg.q_dim))
        rope = cf.RopeStore(meta.positions, meta.pages, meta.slots, self._cos, self._sin,
                            self.k_pool, self.v_pool, layer, cfg.n_heads, cfg.n_kv_heads)
        return cf.linear_rows(x, self._linear[f"l{layer}.qkv"], q,
                              norm=self._norms[f"l{layer}.attn_norm"], eps=cfg.rms_eps,
                              epi=cf.EPI_ROPE, rope=rope, pdl=self.options.pdl, **combine)

    def mlp_in(self, x: Any, layer: int) -> Any:
        """RMSNorm -> gate/up -> SwiGLU; returns [T, F] (decode sizes: norm, then chunks)."""
        fused = cupy_mma.norm_gemm(self, x, f"l{layer}.ffn_norm", f"l{layer}.gate_up",
                                   swiglu=True)
        if fused is not None:  # mma order, decode sizes: one launch (two past 2 rows)
            return fused
        wd = self._linear[f"l{layer}.gate_up"]
        if not self.mma and cc.use_chunks(x.shape[0], wd.shape[0], x.shape[1], cc.EPI_SWIGLU):
            return cc.linear_chunks(self.rmsnorm(x, f"l{layer}.ffn_norm"), wd,
                                    self.new((x.shape[0], wd.shape[0] // 2)),
                                    epi=cc.EPI_SWIGLU, pdl=self.options.pdl)
        if not self.fuses(x, "mlp_in"):
            return stages.mlp_in(self, x, layer)
        out = self.new((x.shape[0], wd.shape[0] // 2))
        return cf.linear_rows(x, wd, out, norm=self._norms[f"l{layer}.ffn_norm"],
                              eps=self.cfg.rms_eps, epi=cf.EPI_SWIGLU, pdl=self.options.pdl)

    def norm_linear(self, x: Any, norm: str, weight: str) -> Any:
        """RMSNorm then a linear layer (the final norm and the LM head, which writes into
        its graph cache's shared logits buffer while a graph is captured)."""
        wd = self._linear[weight]
        out = logits_out(x.shape[0], wd.shape[0]) if weight == "lm_head" else None
        out = self.new((x.shape[0], wd.shape[0])) if out is None else out
        if x.shape[0] >= ck.HEAD_TILED_FROM and wd.shape[0] >= ck.HEAD_WIDE:
            return self._gemm(self.rmsnorm(x, norm), wd, None, out, tiled=True)
        if not self.fuses(x, "norm_linear"):  # under mma: one launch where a form fuses it
            fused = cupy_mma.norm_gemm(self, x, norm, weight, out)
            return self._gemm(self.rmsnorm(x, norm), wd, None, out) if fused is None else fused
        per_sm = cf.HEAD_CTAS_PER_SM if x.shape[0] == 1 else cf.CTAS_PER_SM
        return cf.linear_rows(x, wd, out, norm=self._norms[norm], eps=self.cfg.rms_eps,
                              ctas_per_sm=per_sm, pdl=self.options.pdl)

    def rope_and_store(self, qkv: Any, layer: int, meta: CupyMeta) -> Any:
        cfg = self.cfg
        q = self.new((meta.num_rows, cfg.q_dim))
        rows_launch("rope_store", meta.num_rows,
                    (qkv, q, meta.positions, meta.pages, meta.slots, self._cos, self._sin,
                     self.k_pool, self.v_pool, np.int32(layer), np.int32(cfg.n_layers),
                     np.int32(cfg.n_heads), np.int32(cfg.n_kv_heads),
                     np.int32(cfg.head_dim)), threads=128, pdl=self.options.pdl)
        return q

    def attention(self, q: Any, layer: int, meta: CupyMeta) -> Any:
        from crucible.kernels.attention import step_attention

        if isinstance(q, cupy_rope_in.RawQKV):  # attn_in left RoPE and the K/V store to it
            return cupy_rope_in.attention(self, q, layer, meta)
        out = self.new(q.shape)
        step_attention(q, self.k_pool, self.v_pool, layer, meta, out, n_heads=self.cfg.n_heads,
                       n_kv_heads=self.cfg.n_kv_heads, variant=self.variant,
                       pdl=self.options.pdl, fork=cupy_fork.fork_for(self, meta))
        return out

    def swiglu(self, gate_up: Any) -> Any:
        f = gate_up.shape[1] // 2
        y = self.new((gate_up.shape[0], f))
        flat_launch("swiglu_rows", y.size, (gate_up, y, np.int32(f), np.int64(y.size)),
                    pdl=self.options.pdl)
        return y

    def gather_rows(self, x: Any, meta: CupyMeta) -> Any:
        if meta.all_final:  # decode: every row is final, in order; a copy would change nothing
            return x
        y = self.new((meta.num_final, x.shape[1]))
        rows_launch("gather_rows", meta.num_final, (x, meta.final_rows, y,
                                                     np.int32(x.shape[1])),
                    pdl=self.options.pdl)
        return y

    def to_host(self, x: Any) -> np.ndarray:
        return cupy().asnumpy(x).astype(np.float32, copy=False)
