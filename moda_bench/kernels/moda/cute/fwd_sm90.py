"""The fused route: MoDA's forward with the depth tiles inside FlashAttention-4's Hopper kernel.

Owns: `MoDAForwardSm90` (a subclass of FA4's `FlashAttentionForwardSm90`, CuTe DSL) and
`moda_fused_sm90_fwd` (compile cache and launch), the kernel behind `moda-fused`'s forward.
Imported only where FA4 imports (`fa4.fa4_unavailable() is None`): this module needs cutlass.

What the kernel is. FA4's sm90 forward (pack_gqa, causal, 192-row tiles on 3 consumer warp
groups at d <= 64, 128 rows on 2 at d = 128, one producer warp group) with depth added:
* a depth unit's rows (a consumer group's 64, or a warp's 16 for "spread") are whole positions
  (G must divide 64) whose depth keys are one contiguous row range [pos_lo*L, ...) of k_depth
  viewed (B, T*L, Hk, d); warp 1 of the producer group (idle in FA4) streams them by TMA into
  `depth_stages` stages of their own depth K and depth V pipelines, a stage one `depth_tile`-row
  block per unit (for paired warp steps two half blocks, one of each of the warp's positions);
* the depth steps (fused_sm90_depth) continue the tile's one online softmax: "spread" (the
  default at d <= 64 up to T=16384) runs a warp step after each chunk of the tile's sequence
  blocks; "offset" (else) runs all block steps as one phase after a tile-dependent sequence block
  (the pending P.V completed first, FA4's QK/P.V chain restarted after); "first" starts each tile
  with them;
* the epilogue (O by TMA, the LSE over sequence and depth keys together) is FA4's.
Nothing of FA4's source is copied: the subclass calls FA4's helpers (pipelines, tile scheduler,
block info, masks, softmax, the per-block MMA step, the epilogue) and writes its own launch,
producer and consumer loops, which support only what MoDA needs (causal, pack_gqa, TMA loads,
no varlen, paging, block sparsity, score or mask mods). L = 0 is plain FA4 (the caller's job).
"""

import math
from functools import partial
from types import SimpleNamespace
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_basic
import torch
from cutlass import Float32, Int32, const_expr, pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum
from flash_attn.cute import pipeline as fa_pipeline
from flash_attn.cute import utils as fa_utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned, to_cute_tensor
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import make_packgqa_tiled_tma_atom, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileLPTScheduler, TileSchedulerArguments
from quack import copy_utils, layout_utils, sm90_utils

from moda_bench.kernels.moda.cute.fwd_depth_sm90 import (  # noqa: F401 - the placement policy is re-exported
    PLACEMENTS,
    PROBES,
    ROWS_PER_GROUP,
    WARP_KEYS,
    WARP_ROWS,
    DepthSteps,
    default_depth_stages,
    default_depth_tile,
    default_placement,
    placement_unavailable,
)


class MoDAForwardSm90(DepthSteps, FlashAttentionForwardSm90):
    """FA4's sm90 causal pack_gqa forward with each tile's depth keys scored inside its online softmax."""

    def __init__(self, dtype, head_dim: int, qhead_per_kvhead: int, depth_len: int, *,
                 depth_tile: int = 64, depth_stages: int = 2, placement: str = "offset", prefetch_lead: int = 0,
                 probe: str = ""):
        if ROWS_PER_GROUP % qhead_per_kvhead:
            raise ValueError(f"moda-fused needs G dividing {ROWS_PER_GROUP}, got G={qhead_per_kvhead}")
        if depth_len < 1:
            raise ValueError("moda-fused's kernel needs L >= 1 (L = 0 is plain FA4)")
        tile_m = 192 if head_dim <= 64 else 128
        super().__init__(dtype, head_dim, head_dim, qhead_per_kvhead, is_causal=True, is_local=False,
                         pack_gqa=True, tile_m=tile_m, tile_n=128, num_stages=2,
                         num_threads=(tile_m // ROWS_PER_GROUP + 1) * 128, Q_in_regs=False,
                         intra_wg_overlap=True, mma_pv_is_rs=True)
        reason = placement_unavailable(placement, head_dim)
        if reason:
            raise ValueError(reason)
        self.placement = placement
        self.depth_len = depth_len
        self.depth_stages = depth_stages
        # "spread" runs warp steps (fused_sm90_depth): a stage holds depth_tile rows per warp
        if placement == "spread" and depth_tile not in WARP_KEYS:
            raise ValueError(f"placement 'spread' takes depth_tile in {WARP_KEYS}, got {depth_tile}")
        self.depth_tile = depth_tile
        self.unit_rows = WARP_ROWS if placement == "spread" else ROWS_PER_GROUP  # rows a depth buffer serves
        self.prefetch_lead = prefetch_lead  # "offset": sequence blocks between the L2 prefetch and the phase
        # timing probes (wrong results): "rows0" every tile reads the first depth rows (L2-resident:
        # the depth phase without its DRAM traffic), "nomath" the depth phase waits for and frees
        # its stages without computing (the traffic without the math)
        # "late" ("spread" only): every warp step after the tile's last block (results correct);
        # "noqk" / "nomask" / "nopv" ("spread"): a warp step without that part (DepthSteps.warp_step)
        # "cellmask" (results correct): the mask score by score even where L is a multiple of the step
        if probe not in PROBES:
            raise ValueError(f"probe must be one of {PROBES}, got {probe!r}")
        self.probe = probe
        self.pos_per_unit = max(self.unit_rows // qhead_per_kvhead, 1)
        self.depth_steps = -(-self.pos_per_unit * depth_len // self.depth_tile)

    def depth_units(self) -> int:
        """Depth buffers a stage holds: one per consumer group, one per warp for "spread"."""
        return self.tile_m // self.unit_rows

    # ------------------------------------------------------------------ host side
    def _depth_mmas(self):
        qk = sm90_basic.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, atom_layout_mnk=(self.tile_m // ROWS_PER_GROUP, 1, 1),
            tiler_mn=(ROWS_PER_GROUP, self.depth_tile))
        pv = sm90_basic.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            Float32, atom_layout_mnk=(self.tile_m // ROWS_PER_GROUP, 1, 1),
            tiler_mn=(ROWS_PER_GROUP, self.tile_hdimv), a_source=warpgroup.OperandSource.RMEM)
        return qk, pv

    def _storage_cls(self):
        def buf(layout):
            return cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(layout)], 1024]

        q_bar = cute.struct.MemRange[cutlass.Int64, 2]
        kv_bar = cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
        d_bar = cute.struct.MemRange[cutlass.Int64, self.depth_stages * 2]  # depth K, and depth V
        sq, sk, sv, skd, svd = (buf(x) for x in (self.sQ_layout, self.sK_layout, self.sV_layout,
                                                  self.sKd_layout, self.sVd_layout))

        @cute.struct
        class Storage:
            mbar_q: q_bar
            mbar_k: kv_bar
            mbar_v: kv_bar
            mbar_kd: d_bar
            mbar_vd: d_bar
            sV: sv
            sQ: sq
            sK: sk
            sKd: skd
            sVd: svd

        return Storage

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mKd: cute.Tensor, mVd: cute.Tensor, softmax_scale: Float32,
                 stream: cuda.CUstream = None):
        """q (B,T,Hq,d), k/v (B,T,Hk,d), o like q, lse (B,Hq,T) fp32, kd/vd (B,T*L,Hk,d)."""
        self.varlen_q = False
        mQ, mK, mV, mO, mKd, mVd = [assume_tensor_aligned(t) for t in (mQ, mK, mV, mO, mKd, mVd)]
        mQ, mO, mK, mV, mKd, mVd = [layout_utils.select(t, [1, 3, 2, 0]) for t in (mQ, mO, mK, mV, mKd, mVd)]
        mLSE = layout_utils.select(mLSE, [2, 1, 0])
        tiled_mma_qk, tiled_mma_pv = self._get_tiled_mma()
        tiled_mma_qk_d, tiled_mma_pv_d = (self.warp_depth_mmas() if self.placement == "spread"
                                          else self._depth_mmas())
        self.num_mma_threads = tiled_mma_qk.size
        self.num_threads_per_warp_group = 128
        self.num_wg_mma = self.num_mma_threads // 128
        self.num_threads = 128 * (self.num_wg_mma + 1)
        self.num_producer_threads = 32
        self.num_Q_load_threads = 128
        self.num_epilogue_threads = self.num_mma_threads
        self.num_mma_regs, self.num_producer_regs = {2: (240, 24), 3: (160, 32)}[self.num_wg_mma]
        self.use_block_sparsity = False
        self.use_scheduler_barrier = self.num_wg_mma >= 2 and self.tile_hdim <= 128
        self.use_tma_Q = True
        self.use_tma_O = True
        self.rescale_O_before_gemm = False
        self._setup_attributes()
        self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout = [
            sm90_utils.make_smem_layout(mX.element_type, LayoutEnum.ROW_MAJOR, shape, stage)
            for mX, shape, stage in [(mQ, (self.tile_m, self.tile_hdim), None),
                                     (mK, (self.tile_n, self.tile_hdim), self.num_stages),
                                     (mV, (self.tile_n, self.tile_hdimv), self.num_stages),
                                     (mO, (self.tile_m, self.tile_hdimv), None)]]
        n_depth_bufs = self.depth_stages * self.depth_units()
        self.sKd_layout = sm90_utils.make_smem_layout(mKd.element_type, LayoutEnum.ROW_MAJOR,
                                                      (self.depth_tile, self.tile_hdim), n_depth_bufs)
        self.sVd_layout = sm90_utils.make_smem_layout(mVd.element_type, LayoutEnum.ROW_MAJOR,
                                                      (self.depth_tile, self.tile_hdimv), n_depth_bufs)
        # the TMA boxes: a unit's block, or ("paired") each of its two positions' halves of it
        # (the same bytes: a 16-row half is two whole swizzle periods)
        box_rows, halves = self.depth_box()
        sKd_tma_layout, sVd_tma_layout = [
            sm90_utils.make_smem_layout(mX.element_type, LayoutEnum.ROW_MAJOR, (box_rows, hd), n_depth_bufs * halves)
            for mX, hd in ((mKd, self.tile_hdim), (mVd, self.tile_hdimv))]
        self.sP_layout = None
        Storage = self._storage_cls()

        mQ_og, mO_og = mQ, mO
        nheads_kv = mK.shape[2]
        mQ = pack_gqa_layout(mQ, self.qhead_per_kvhead, nheads_kv, head_idx=2)
        mO = pack_gqa_layout(mO, self.qhead_per_kvhead, nheads_kv, head_idx=2)
        mLSE = pack_gqa_layout(mLSE, self.qhead_per_kvhead, nheads_kv, head_idx=1)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        s2g = cpasync.CopyBulkTensorTileS2GOp()
        self.tma_copy_bytes = {
            name: cute.size_in_bytes(mX.element_type, cute.select(layout, mode=[0, 1]))
            for name, mX, layout in [("Q", mQ, self.sQ_layout), ("K", mK, self.sK_layout),
                                     ("V", mV, self.sV_layout), ("Kd", mKd, self.sKd_layout),
                                     ("Vd", mVd, self.sVd_layout)]}
        for name in ("Kd", "Vd"):  # a stage holds one block per consumer group (per warp: "spread")
            self.tma_copy_bytes[name] *= self.depth_units()
        packgqa_atom = partial(make_packgqa_tiled_tma_atom, qhead_per_kvhead=self.qhead_per_kvhead, head_idx=2)
        tma_atom_Q, tma_tensor_Q = packgqa_atom(g2s, mQ_og, self.sQ_layout, (self.tile_m, self.tile_hdim))
        tma_atom_O, tma_tensor_O = packgqa_atom(s2g, mO_og, self.sO_layout, (self.tile_m, self.tile_hdimv))
        atoms = [cpasync.make_tiled_tma_atom(g2s, mX, cute.select(layout, mode=[0, 1]), tile, 1)
                 for mX, layout, tile in [(mK, self.sK_layout, (self.tile_n, self.tile_hdim)),
                                          (mV, self.sV_layout, (self.tile_n, self.tile_hdimv)),
                                          (mKd, sKd_tma_layout, (box_rows, self.tile_hdim)),
                                          (mVd, sVd_tma_layout, (box_rows, self.tile_hdimv))]]
        (tma_atom_K, tma_tensor_K), (tma_atom_V, tma_tensor_V), (tma_atom_Kd, tma_tensor_Kd), \
            (tma_atom_Vd, tma_tensor_Vd) = atoms

        sched_args = TileSchedulerArguments(
            cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m), cute.size(mQ.shape[2]),
            cute.size(mQ.shape[3]), 1, cute.size(mK.shape[0]), mQ.shape[1], mV.shape[1],
            total_q=cute.size(mQ.shape[0]) * cute.size(mQ.shape[3]),
            tile_shape_mn=(self.tile_m, self.tile_n), mCuSeqlensQ=None, mSeqUsedQ=None,
            qhead_per_kvhead_packgqa=self.qhead_per_kvhead, element_size=self.dtype.width // 8,
            is_persistent=False, lpt=True)
        sched_params = SingleTileLPTScheduler.to_underlying_arguments(sched_args)
        grid = SingleTileLPTScheduler.get_grid_shape(sched_params)
        softmax_scale_log2, softmax_scale = fa_utils.compute_softmax_scale_log2(softmax_scale, None)
        self.kernel(tma_tensor_Q, tma_tensor_K, tma_tensor_V, tma_tensor_O, mLSE, tma_tensor_Kd,
                    tma_tensor_Vd, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, tma_atom_Kd,
                    tma_atom_Vd, softmax_scale_log2, softmax_scale, self.sQ_layout, self.sK_layout,
                    self.sV_layout, self.sO_layout, self.sKd_layout, self.sVd_layout, sKd_tma_layout,
                    sVd_tma_layout, tiled_mma_qk, tiled_mma_pv, tiled_mma_qk_d, tiled_mma_pv_d, sched_params,
                    SingleTileLPTScheduler, Storage,
                    ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream,
                             min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mKd: cute.Tensor, mVd: cute.Tensor,
               tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom, tma_atom_V: cute.CopyAtom,
               tma_atom_O: cute.CopyAtom, tma_atom_Kd: cute.CopyAtom, tma_atom_Vd: cute.CopyAtom,
               softmax_scale_log2: Float32, softmax_scale: Optional[Float32],
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout,
               sKd_layout: cute.ComposedLayout, sVd_layout: cute.ComposedLayout,
               sKd_tma_layout: cute.ComposedLayout, sVd_tma_layout: cute.ComposedLayout,
               tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               tiled_mma_qk_d: cute.TiledMma, tiled_mma_pv_d: cute.TiledMma,
               tile_sched_params, TileScheduler: cutlass.Constexpr, Storage: cutlass.Constexpr):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, tma_atom_Kd, tma_atom_Vd):
                cpasync.prefetch_descriptor(atom)
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        mma_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        make = partial(fa_pipeline.PipelineTmaAsync.create, producer_group=one_thread,
                       consumer_group=mma_warps, defer_sync=True)
        pipeline_q = make(barrier_storage=storage.mbar_q.data_ptr(), num_stages=1,
                          tx_count=self.tma_copy_bytes["Q"])
        pipeline_k = make(barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.num_stages,
                          tx_count=self.tma_copy_bytes["K"])
        pipeline_v = make(barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.num_stages,
                          tx_count=self.tma_copy_bytes["V"])
        pipeline_kd = make(barrier_storage=storage.mbar_kd.data_ptr(), num_stages=self.depth_stages,
                           tx_count=self.tma_copy_bytes["Kd"])
        pipeline_vd = make(barrier_storage=storage.mbar_vd.data_ptr(), num_stages=self.depth_stages,
                           tx_count=self.tma_copy_bytes["Vd"])
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sKd = storage.sKd.get_tensor(sKd_layout.outer, swizzle=sKd_layout.inner)
        sVd = storage.sVd.get_tensor(sVd_layout.outer, swizzle=sVd_layout.inner)
        sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner, dtype=self.dtype)
        block_info = BlockInfo(self.tile_m, self.tile_n, True, False, False, None, None,
                               qhead_per_kvhead_packgqa=self.qhead_per_kvhead)
        seqlen_cls = partial(SeqlenInfoQK.create, seqlen_q_static=mQ.shape[0][1],
                             seqlen_k_static=mK.shape[0])
        sched_cls = partial(TileScheduler.create, tile_sched_params)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                self.load_sequence(mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V,
                                   pipeline_q, pipeline_k, pipeline_v, block_info, seqlen_cls, sched_cls)
            if warp_idx == 1:
                sKd_t = storage.sKd.get_tensor(sKd_tma_layout.outer, swizzle=sKd_tma_layout.inner)
                sVd_t = storage.sVd.get_tensor(sVd_tma_layout.outer, swizzle=sVd_tma_layout.inner)
                self.load_depth(mKd, mVd, sKd_t, sVd_t, tma_atom_Kd, tma_atom_Vd, pipeline_kd, pipeline_vd, sched_cls)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            tidx = cute.arch.thread_idx()[0] - 128
            self.mma_moda(tiled_mma_qk, tiled_mma_pv, tiled_mma_qk_d, tiled_mma_pv_d, mO, mLSE,
                          sQ, sK, sV, sKd, sVd, sO, tma_atom_O, pipeline_q, pipeline_k, pipeline_v,
                          pipeline_kd, pipeline_vd, tidx, softmax_scale_log2, softmax_scale, block_info,
                          seqlen_cls, sched_cls, mKd, mVd, tma_atom_Kd, tma_atom_Vd)

    @cute.jit
    def load_sequence(self, mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V,
                      pipeline_q, pipeline_k, pipeline_v, block_info, seqlen_cls, sched_cls):
        """Warp 0: Q, then the sequence K/V blocks from the diagonal down, K one block ahead of V."""
        q_phase = Int32(1)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        scheduler = sched_cls()
        work = scheduler.initial_work_tile_info()
        while work.is_valid_tile:
            m_block, head_idx, batch_idx, _ = work.tile_idx
            seqlen = seqlen_cls(batch_idx)
            gQ = cute.local_tile(mQ[None, None, head_idx, batch_idx], (self.tile_m, self.tile_hdim),
                                 (m_block, 0))
            load_q, _, _ = copy_utils.tma_get_copy_fn(tma_atom_Q, 0, cute.make_layout(1), gQ, sQ,
                                                      single_stage=True)
            gK = cute.local_tile(mK[None, None, head_idx, batch_idx], (self.tile_n, self.tile_hdim), (None, 0))
            gV = cute.local_tile(mV[None, None, head_idx, batch_idx], (self.tile_n, self.tile_hdimv), (None, 0))
            copy_k, _, _ = copy_utils.tma_get_copy_fn(tma_atom_K, 0, cute.make_layout(1), gK, sK)
            copy_v, _, _ = copy_utils.tma_get_copy_fn(tma_atom_V, 0, cute.make_layout(1), gV, sV)
            load_k = partial(self.load_KV, copy_utils.tma_producer_copy_fn(copy_k, pipeline_k), None,
                             sK, pipeline_kv=pipeline_k, K_or_V="K")
            load_v = partial(self.load_KV, copy_utils.tma_producer_copy_fn(copy_v, pipeline_v), None,
                             sV, pipeline_kv=pipeline_v, K_or_V="V")
            n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block)
            pipeline_k.producer_acquire(state)
            load_k(block=n_block_max - 1, producer_state=state)
            pipeline_q.producer_acquire_w_index_phase(0, q_phase)
            load_q(tma_bar_ptr=pipeline_q.sync_object_full.get_barrier(0))
            q_phase ^= 1
            for i in cutlass.range(n_block_max - 1 - n_block_min, unroll=1):
                prev = state.clone()
                state.advance()
                pipeline_k.producer_acquire(state)
                load_k(block=n_block_max - 2 - i, producer_state=state)
                pipeline_v.producer_acquire(prev)
                load_v(block=n_block_max - 1 - i, producer_state=prev)
            pipeline_v.producer_acquire(state)
            load_v(block=n_block_min, producer_state=state)
            state.advance()
            scheduler.prefetch_next_work()
            scheduler.advance_to_next_work()
            work = scheduler.get_current_work()
        pipeline_v.producer_tail(state)

    @cute.jit
    def load_depth(self, mKd, mVd, sKd, sVd, tma_atom_Kd, tma_atom_Vd, pipeline_kd, pipeline_vd, sched_cls):
        """Warp 1: per tile, `depth_steps` steps, each a stage of depth K then of depth V holding one
        block per depth unit, a consumer group or ("spread") a warp (buffer stage * units + unit)."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.depth_stages)
        scheduler = sched_cls()
        work = scheduler.initial_work_tile_info()
        n_units = self.depth_units()
        halves = self.depth_box()[1]
        while work.is_valid_tile:
            m_block, head_idx, batch_idx, _ = work.tile_idx
            copies = self.depth_copies(mKd, mVd, sKd, sVd, tma_atom_Kd, tma_atom_Vd, m_block, head_idx, batch_idx)
            for s in cutlass.range(self.depth_steps, unroll=1):
                for kv, pipe in ((0, pipeline_kd), (1, pipeline_vd)):
                    pipe.producer_acquire(state)
                    bar = pipe.producer_get_barrier(state)
                    for u in cutlass.range_constexpr(n_units):
                        for h in cutlass.range_constexpr(halves):
                            copies[u][h][kv][0](src_idx=s, dst_idx=(state.index * n_units + u) * halves + h,
                                                tma_bar_ptr=bar)
                    pipe.producer_commit(state)
                state.advance()
            scheduler.advance_to_next_work()
            work = scheduler.get_current_work()
        pipeline_vd.producer_tail(state)

    def depth_box(self):
        """(rows, boxes) of a unit's TMA block a step: (depth_tile, 1), or (depth_tile / 2, 2) for
        paired warp steps (`DepthSteps.paired`: 16 keys of each of the warp's two positions)."""
        return (self.depth_tile // 2, 2) if self.paired() else (self.depth_tile, 1)

    @cute.jit
    def depth_copies(self, mKd, mVd, sKd, sVd, tma_atom_Kd, tma_atom_Vd, m_block, head_idx, batch_idx):
        """Per depth unit and box, (K, V) of (TMA copy function, gmem blocks): the unit's depth rows
        [pos_lo * L, ...) in `depth_tile`-row blocks, or (paired) each of its two positions' rows in
        half blocks."""
        copies = []
        rows, halves = self.depth_box()
        for u in cutlass.range_constexpr(self.depth_units()):
            row0 = (m_block * self.tile_m + u * self.unit_rows) // self.qhead_per_kvhead * self.depth_len
            if const_expr(self.probe == "rows0"):
                row0 = u * self.pos_per_unit * self.depth_len
            boxes = []
            for h in cutlass.range_constexpr(halves):
                pair = []
                for m, sm, atom, hd in ((mKd, sKd, tma_atom_Kd, self.tile_hdim),
                                        (mVd, sVd, tma_atom_Vd, self.tile_hdimv)):
                    g = cute.local_tile(cute.domain_offset((row0 + h * self.depth_len, 0),
                                                           m[None, None, head_idx, batch_idx]),
                                        (rows, hd), (None, 0))
                    fn, _, g_part = copy_utils.tma_get_copy_fn(atom, 0, cute.make_layout(1), g, sm)
                    pair.append((fn, g_part, atom))
                boxes.append(pair)
            copies.append(boxes)
        return copies

    @cute.jit
    def prefetch_depth(self, copies, first_step):
        """L2 prefetch (TMA) of the tile's depth blocks from `first_step` on, all units, K and V."""
        for s in cutlass.range(first_step, self.depth_steps, unroll=1):
            for u in cutlass.range_constexpr(self.depth_units()):
                for h in cutlass.range_constexpr(self.depth_box()[1]):
                    for kv in cutlass.range_constexpr(2):
                        cute.prefetch(copies[u][h][kv][2], copies[u][h][kv][1][None, s])

    @cute.jit
    def mma_moda(self, tiled_mma_qk, tiled_mma_pv, tiled_mma_qk_d, tiled_mma_pv_d, mO, mLSE,
                 sQ, sK, sV, sKd, sVd, sO, tma_atom_O, pipeline_q, pipeline_k, pipeline_v,
                 pipeline_kd, pipeline_vd, tidx, softmax_scale_log2, softmax_scale, block_info, seqlen_cls,
                 sched_cls, mKd, mVd, tma_atom_Kd, tma_atom_Vd):
        group = cute.arch.make_warp_uniform(tidx // 128)
        group_layout = cute.make_layout(self.num_wg_mma, stride=128)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        wg_qk, wg_pv = (m.get_slice(group_layout(group)) for m in (tiled_mma_qk, tiled_mma_pv))
        _, tSrQ, tSrK = sm90_utils.partition_fragment_ABC(wg_qk, (self.tile_m, self.tile_n, self.tile_hdim), sQ, sK)
        acc_O, tOrP, tOrVt = sm90_utils.partition_fragment_ABC(
            wg_pv, (self.tile_m, self.tile_hdimv, self.tile_n), None, layout_utils.transpose_view(sV))
        mma_qk = partial(sm90_utils.gemm_zero_init, tiled_mma_qk, (self.tile_m, self.tile_n), tSrQ, tSrK)
        mma_pv = partial(sm90_utils.gemm_w_idx, tiled_mma_pv, acc_O, tOrP, tOrVt)
        spread = self.placement == "spread"
        if const_expr(spread):
            w = (tiled_mma_qk_d, tiled_mma_pv_d, group, sQ, sKd, sVd, acc_O)  # set up in each step
            acc_shape_S = tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        else:
            thr_mma_qk_d = tiled_mma_qk_d.get_slice(tidx)
            wg_qk_d, wg_pv_d = (m.get_slice(group_layout(group)) for m in (tiled_mma_qk_d, tiled_mma_pv_d))
            _, tSrQd, tSrKd = sm90_utils.partition_fragment_ABC(
                wg_qk_d, (self.tile_m, self.depth_tile, self.tile_hdim), sQ, sKd)
            _, tOrPd, tOrVdt = sm90_utils.partition_fragment_ABC(
                wg_pv_d, (self.tile_m, self.tile_hdimv, self.depth_tile), None, layout_utils.transpose_view(sVd))
            mma_qk_d = partial(self.group_gemm, partial(sm90_utils.gemm_zero_init, tiled_mma_qk_d,
                                                        (self.tile_m, self.depth_tile), tSrQd, tSrKd), group)
            mma_pv_d = partial(self.group_gemm, partial(sm90_utils.gemm_w_idx, tiled_mma_pv_d, acc_O, tOrPd,
                                                        tOrVdt), group)
            mask_d = partial(self.depth_mask, thr_mma=thr_mma_qk_d, group=group)
        no_smem_p = SimpleNamespace(smem_thr_copy_P=None, tPsP=None)
        self.mma_init()
        q_phase = Int32(0)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        d_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.depth_stages)
        softmax = Softmax.create(softmax_scale_log2, num_rows=acc_O.shape[0][0] * acc_O.shape[1],
                                 softmax_scale=softmax_scale)
        scheduler = sched_cls()
        work = scheduler.initial_work_tile_info()
        while work.is_valid_tile:
            m_block, head_idx, batch_idx, _ = work.tile_idx
            seqlen = seqlen_cls(batch_idx)
            mask = AttentionMask(self.tile_m, self.tile_n, seqlen, window_size_left=None,
                                 window_size_right=None, qhead_per_kvhead_packgqa=self.qhead_per_kvhead)
            mask_fn = partial(mask.apply_mask, batch_idx=batch_idx, head_idx=head_idx, m_block=m_block,
                              thr_mma=thr_mma_qk, mask_causal=True, mask_local=False)
            one_block = partial(self.mma_one_n_block_intrawg_overlap, mma_qk_fn=mma_qk,
                                pipeline_k=pipeline_k, pipeline_v=pipeline_v, acc_O=acc_O, tOrP=tOrP,
                                smem_copy_params=no_smem_p, softmax=softmax, seqlen=seqlen,
                                check_inf=True)
            if const_expr(spread):
                steps_to = partial(self.spread_steps, w, pipeline_kd=pipeline_kd,
                                   pipeline_vd=pipeline_vd, softmax=softmax, acc_O=acc_O, tOrP=tOrP,
                                   acc_shape_S=acc_shape_S)
            else:
                depth = partial(self.depth_phase, mma_qk_d=mma_qk_d, mma_pv_d=mma_pv_d, pipeline_kd=pipeline_kd,
                                pipeline_vd=pipeline_vd, tOrPd=tOrPd, softmax=softmax, seqlen=seqlen, acc_O=acc_O,
                                mask_d=mask_d, no_smem_p=no_smem_p)
            n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block)
            done = Int32(0)  # "spread": warp steps run in this tile
            n_causal = block_info.get_n_block_min_causal_local_mask(seqlen, m_block, n_block_min)
            pipeline_q.consumer_wait_w_index_phase(0, q_phase)
            O_acc = False
            depth_done = False
            if const_expr(self.placement == "first"):
                # the depth keys first: they start the online softmax and O; the diagonal block
                # continues it (FA4's first half-block would restart it)
                d_state = depth(d_state, start=True)
                depth_done = True
                kv_state = self.continue_block(kv_state, n_block_max - 1, mma_qk, pipeline_k, tOrP, softmax, acc_O,
                                               partial(mask_fn, mask_seqlen=True))
                O_acc = True
            else:
                kv_state = self.first_half_block_overlap(
                    n_block_max - 1, mma_qk, kv_state, pipeline_k, tOrP, no_smem_p, softmax, seqlen,
                    mask_fn=mask_fn, is_first_block=True)
            if const_expr(spread):  # warp steps may add to O before the first P.V
                acc_O.fill(0.0)
                O_acc = True
            n_block_max -= 1
            for i in cutlass.range(n_block_max - n_causal, unroll=1):
                kv_state = one_block(kv_state, n_block=n_block_max - 1 - i,
                                     mma_pv_fn=partial(mma_pv, zero_init=not O_acc),
                                     mask_fn=partial(mask_fn, mask_seqlen=False))
                O_acc = True
            n_block_max = cutlass.min(n_block_max, n_causal)
            n = n_block_max - 1  # the blocks below the diagonal
            if const_expr(spread):
                # chunks of `chunk` blocks (FA4's loop alone inside), a warp step after each while
                # steps remain; the rest after the tile's last block
                chunk = cutlass.max((n_block_max - n_block_min) // self.depth_steps, 1)
                while n >= n_block_min:
                    stop = cutlass.max(n - chunk, n_block_min - 1)
                    while n > stop:
                        kv_state = one_block(kv_state, n_block=n, mma_pv_fn=partial(mma_pv, zero_init=False),
                                             mask_fn=None)
                        n -= 1
                    if const_expr(self.probe != "late"):
                        d_state, done = steps_to(d_state, done, cutlass.min(done + 1, self.depth_steps), pending=True)
            else:
                # "offset" runs the depth phase after the block `at`, a different block per tile, so
                # that the tiles of one wave ask for their depth bytes at different times: the pending
                # P.V is completed first, and the next block restarts FA4's QK/PV chain
                i = Int32(0)
                at = (m_block * 5 + head_idx * 3 + batch_idx) % cutlass.max(n_block_max - n_block_min, 1)
                while n >= n_block_min:
                    if const_expr(self.placement == "offset" and self.prefetch_lead > 0):
                        # the depth blocks past the smem stages into L2 a few blocks before the phase
                        if i == cutlass.max(at - self.prefetch_lead, 0) and tidx == 0:
                            self.prefetch_depth(self.depth_copies(mKd, mVd, sKd, sVd, tma_atom_Kd, tma_atom_Vd, m_block,
                                                                  head_idx, batch_idx), self.depth_stages)
                    kv_state = one_block(kv_state, n_block=n, mma_pv_fn=partial(mma_pv, zero_init=not O_acc),
                                         mask_fn=None)
                    O_acc = True
                    n -= 1
                    if const_expr(self.placement == "offset"):
                        if i == at and n >= n_block_min:
                            kv_state = self.last_half_block_overlap(kv_state, pipeline_v, mma_pv, zero_init=False)
                            d_state = depth(d_state, start=False)
                            depth_done = True
                            kv_state = self.continue_block(kv_state, n, mma_qk, pipeline_k, tOrP, softmax, acc_O, None)
                            n -= 1
                    i += 1
            kv_state = self.last_half_block_overlap(kv_state, pipeline_v, mma_pv, zero_init=not O_acc)
            if const_expr(spread):
                d_state, done = steps_to(d_state, done, self.depth_steps, pending=False)
            elif not depth_done:
                d_state = depth(d_state, start=False)
            pipeline_q.consumer_release_w_index(0)
            q_phase ^= 1
            softmax.rescale_O(acc_O, softmax.finalize())
            self.epilogue(acc_O, softmax.row_sum, mO, mLSE, sO, seqlen, None, tma_atom_O,
                          tiled_mma_pv, tidx, m_block, head_idx, batch_idx)
            scheduler.advance_to_next_work()
            work = scheduler.get_current_work()


_COMPILED: dict = {}


def _compiled(q, k, v, out, lse, kd, vd, scale: float, L: int, depth_tile: int | None, depth_stages: int | None,
              placement: str | None, prefetch_lead: int, probe: str = ""):
    """The compiled launch for these tensors' dtype, head size, G and L (cached per process);
    placement, depth_tile and depth_stages None: `default_placement`, `default_depth_tile`,
    `default_depth_stages`."""
    d, G = q.shape[3], q.shape[2] // k.shape[2]
    placement = default_placement(q.shape[1], d) if placement is None else placement
    depth_tile = default_depth_tile(d, placement) if depth_tile is None else depth_tile
    depth_stages = default_depth_stages(placement) if depth_stages is None else depth_stages
    key = (q.dtype, d, G, L, depth_tile, depth_stages, placement, prefetch_lead, probe)
    if key not in _COMPILED:
        dtype = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[q.dtype]
        kern = MoDAForwardSm90(dtype, d, G, L, depth_tile=depth_tile, depth_stages=depth_stages,
                               placement=placement, prefetch_lead=prefetch_lead, probe=probe)
        args = [to_cute_tensor(t) for t in (q, k, v, out)]
        args.append(to_cute_tensor(lse, assumed_align=4))
        args += [to_cute_tensor(t) for t in (kd, vd)]
        _COMPILED[key] = cute.compile(kern, *args, scale,
                                      cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                                      options="--enable-tvm-ffi")
    return _COMPILED[key]


def _operands(q, k, v, k_depth, v_depth, scale):
    """out, lse, the (B, T*L, Hk, d) views of the depth tensors, L and the softmax scale."""
    B, T, Hq, d = q.shape
    Hk, L = k.shape[2], k_depth.shape[2]
    kd = k_depth.reshape(B, T * L, Hk, d)
    vd = v_depth.reshape(B, T * L, Hk, d)
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
    return out, lse, kd, vd, L, 1.0 / math.sqrt(d) if scale is None else float(scale)


def moda_fused_sm90_compile(q, k, v, k_depth, v_depth, scale: float | None = None, *,
                            depth_tile: int | None = None, depth_stages: int | None = None,
                            placement: str | None = None, prefetch_lead: int = 0):
    """Compile only (works under torch's FakeTensorMode with FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH set)."""
    out, lse, kd, vd, L, scale = _operands(q, k, v, k_depth, v_depth, scale)
    return _compiled(q, k, v, out, lse, kd, vd, scale, L, depth_tile, depth_stages, placement, prefetch_lead)


def moda_fused_sm90_fwd(q, k, v, k_depth, v_depth, scale: float | None = None, *,
                        depth_tile: int | None = None, depth_stages: int | None = None, placement: str | None = None,
                        prefetch_lead: int = 0, probe: str = ""):
    """out (B,T,Hq,d) and lse (B,Hq,T) fp32 of causal MoDA; k_depth/v_depth (B,T,L,Hk,d), L >= 1."""
    out, lse, kd, vd, L, scale = _operands(q, k, v, k_depth, v_depth, scale)
    _compiled(q, k, v, out, lse, kd, vd, scale, L, depth_tile, depth_stages, placement, prefetch_lead, probe)(
        q, k, v, out, lse, kd, vd, scale)
    return out, lse
