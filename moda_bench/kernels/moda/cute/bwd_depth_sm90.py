"""The depth part of MoDA's backward as a CuTe DSL kernel of independent warps (the backward of
`moda-overlap` / `moda-fused`).

Owns: `DepthBwdSm90` (the kernel) and `depth_bwd_sm90` (compile cache and launch), a drop-in for
`triton.depth.depth_bwd`: given the merged out and lse of the whole MoDA softmax, the depth keys'
share of dq and, with depth_grad, dk_depth and dv_depth. Imported only where FA4 imports (it
needs cutlass); moda_fa4 falls back to the Triton kernel where `fa4.cute_bwd_unavailable` says why.

Why a second kernel. The Triton streaming kernel's program is one chain of small dependent
products on 4 warps (one a scheduler), so its bandwidth a program is low and the overlap route's
backward took many SMs from FA4 at short T. Here every warp is its own program: no CTA barrier,
no shared pipeline; the 8 warps of a CTA hide each other's latency. The kernel is bound by the
SM's shared-memory pipe, so the options that cut shared-memory wavefronts are the ones that pay:
`keep_rows` (a unit's q and dO operands held in registers) and `tma_store` (a full step's dK and
dV rows leave by two TMA bulk stores from its buffers instead of vector loads and stores).
docs/DESIGN.md ("The depth backward in CuTe") has the measurements.

What a warp does. A unit is 16 folded rows r = t*G + g of one KV head (16/G whole positions; G
must divide 16) and their positions' depth keys, one contiguous row range of k_depth viewed
(B, T*L, Hk, d). The warp walks its units (unit u = warp, warp + all warps, ...; KV head fastest)
as one flat loop over (unit, step of `step_keys` keys, default 32) with its own cp.async pipeline
of `stages` steps (the next unit's q and do rows ride with its first step; its step counters are
advanced, not divided out). Per step, with mma.sync m16n8k16 and
ldmatrix operands, in the transposed form (keys as M, so P^T and dS^T feed the next products
from registers):
    S^T = K_d Q^T,  P^T = exp2(S^T * scale*log2(e) - lse2) masked to the key's own position,
    dP^T = V_d dO^T,  dS^T = scale * P^T * (dP^T - delta),
    dV_d = P^T dO,  dK_d = dS^T Q   (through the step's shared buffers: TMA for a full step),
    dQ += dS K_d                    (dS^T through a per-warp scratch, ldmatrix.trans).
A depth key is read by its own position's G rows only, so a warp writes its keys' gradients
alone: no atomics. lse2 = lse*log2(e) (+inf past T) and delta = rowsum(o*do) are computed per
unit from o, do and lse loaded into registers a step ahead.
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.utils import LayoutEnum
from flash_attn.cute import ampere_helpers as sm80_helpers
from flash_attn.cute import copy_utils as fa_copy
from flash_attn.cute import utils as fa_utils
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned, to_cute_tensor
from quack import layout_utils, sm90_utils

from moda_bench.kernels.moda.validate import MoDAShape, cute_bwd_shape_problem

WARP_ROWS = 16  # folded rows of a unit (one mma.sync M, or N in the transposed products)
STEP_KEYS = 32  # depth keys a step
SMEM_LIMIT = 232448  # opt-in shared memory a block on the H100 / H200 (227 KB)
LOG2E = math.log2(math.e)


def unavailable(q, kd, G: int) -> str | None:
    """Why this kernel cannot take these inputs (None if it can; `validate.cute_bwd_shape_problem`)."""
    B, T, Hq, d = q.shape
    return cute_bwd_shape_problem(MoDAShape(B, T, Hq, kd.shape[3], d, kd.shape[2]), q.dtype)


class DepthBwdSm90:
    """The depth backward over 16-row units, one warp each (see module)."""

    def __init__(self, dtype, head_dim: int, G: int, L: int, *, warps: int = 8, stages: int = 2,
                 depth_grad: bool = True, step_keys: int = STEP_KEYS, keep_rows: bool = True,
                 tma_store: bool = True):
        assert WARP_ROWS % G == 0 and head_dim % 16 == 0 and L >= 1 and stages >= 2 and step_keys in (16, 32)
        self.dtype, self.D, self.G, self.L, self.step_keys = dtype, head_dim, G, L, step_keys
        self.P = WARP_ROWS // G  # positions a unit
        self.steps = -(-self.P * L // step_keys)  # steps a unit
        self.warps, self.stages, self.depth_grad = warps, stages, depth_grad
        self.keep_rows = keep_rows  # q and do operand fragments loaded once a unit, not every step
        self.tma_store = tma_store and depth_grad  # a full step's dK / dV rows leave by TMA from its buffers
        # q/do row slots: a unit's rows stay until its last step while the loads run stages - 1 steps ahead
        self.rslots = min(stages, (stages - 2) // self.steps + 2)
        row_bytes = head_dim * dtype.width // 8
        smem = warps * (2 * row_bytes * (stages * step_keys + self.rslots * WARP_ROWS) + step_keys * WARP_ROWS * 2
                        + 256) + 4096  # K/V stages, q/do slots, scratch, stats; alignment
        if smem > SMEM_LIMIT:
            raise ValueError(f"depth_bwd_sm90: {warps} warps x {stages} stages need ~{smem // 1024} KB of shared "
                             f"memory, more than {SMEM_LIMIT // 1024} KB (at d=64, 8 warps take 2 stages of 32 keys)")

    # ------------------------------------------------------------------ launch
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mDO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mKd: cute.Tensor, mVd: cute.Tensor, mDQ: cute.Tensor, mDKd: cute.Tensor, mDVd: cute.Tensor,
                 scale: Float32, programs: Int32, stream: cuda.CUstream = None):
        mQ, mDO, mO, mKd, mVd, mDQ, mDKd, mDVd = [assume_tensor_aligned(t)
                                                   for t in (mQ, mDO, mO, mKd, mVd, mDQ, mDKd, mDVd)]
        D, W, S = self.D, self.warps, self.stages
        atom = sm80_helpers.get_smem_layout_atom(self.dtype, D)
        sKV_layout = cute.tile_to_shape(atom, (self.step_keys, D, W * S), (0, 1, 2))
        sRow_layout = cute.tile_to_shape(atom, (WARP_ROWS, D, W * self.rslots), (0, 1, 2))
        sScr_layout = cute.make_ordered_layout((self.step_keys, WARP_ROWS, W), order=(1, 0, 2))
        sStat_layout = cute.make_ordered_layout((WARP_ROWS, 2, W), order=(0, 1, 2))

        @cute.struct
        class Storage:
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sRow_layout)], 1024]
            sDO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sRow_layout)], 1024]
            sScr: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sScr_layout)], 128]
            sStat: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sStat_layout)], 128]

        mma = cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (1, 1, 1),
                                  permutation_mnk=(16, 16, 16))
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                  num_bits_per_copy=128)
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr = cute.make_ordered_layout((32 // (D // 8), D // 8), order=(1, 0))
        val = cute.make_layout((1, 8))
        copy_in = cute.make_tiled_copy_tv(g2s, thr, val)
        copy_out = cute.make_tiled_copy_tv(vec, thr, val)
        scale_log2 = scale * LOG2E
        tma_dK = tma_dV = mDKt = mDVt = None
        # the K / V buffers as TMA sees them: the same bytes (rows of D, 128-byte swizzle, slots in
        # order), its swizzle on the pointer (sKV_layout's element swizzle made TMA split a step's box
        # into 64 stores)
        sKV_tma = sm90_utils.make_smem_layout(self.dtype, LayoutEnum.ROW_MAJOR, (self.step_keys, D), W * S)
        if const_expr(self.tma_store):
            slot = cute.select(sKV_tma, mode=[0, 1])
            # the box tiles a tensor's first two modes: (T*L, D, Hk, B), the same memory
            tma_dK, mDKt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), self.rows_first(mDKd),
                                                       slot, (self.step_keys, D))
            tma_dV, mDVt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), self.rows_first(mDVd),
                                                       slot, (self.step_keys, D))
        self.kernel(mQ, mDO, mO, mLSE, mKd, mVd, mDQ, mDKd, mDVd, mDKt, mDVt, tma_dK, tma_dV, scale, scale_log2,
                    sKV_layout, sKV_tma, sRow_layout, sScr_layout, sStat_layout, mma, copy_in, copy_out,
                    Storage).launch(
            grid=[programs, 1, 1], block=[32 * W, 1, 1], smem=Storage.size_in_bytes(), stream=stream)

    # ------------------------------------------------------------------ the kernel
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mDO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mKd: cute.Tensor,
               mVd: cute.Tensor, mDQ: cute.Tensor, mDKd: cute.Tensor, mDVd: cute.Tensor, mDKt, mDVt,
               tma_dK, tma_dV, scale: Float32,
               scale_log2: Float32, sKV_layout: cute.ComposedLayout, sKV_tma: cute.ComposedLayout,
               sRow_layout: cute.ComposedLayout,
               sScr_layout: cute.Layout, sStat_layout: cute.Layout, mma: cute.TiledMma, copy_in: cute.TiledCopy,
               copy_out: cute.TiledCopy, Storage: cutlass.Constexpr):
        D, W, S, G, P, L, NS = self.D, self.warps, self.stages, self.G, self.P, self.L, self.steps
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nblk, _, _ = cute.arch.grid_dim()
        wid = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(Storage)
        sK = st.sK.get_tensor(sKV_layout)  # composed layouts: an element swizzle (not the pointer's byte swizzle)
        sV = st.sV.get_tensor(sKV_layout)
        sK_tma = st.sK.get_tensor(sKV_tma.outer, swizzle=sKV_tma.inner)  # the same bytes, for TMA
        sV_tma = st.sV.get_tensor(sKV_tma.outer, swizzle=sKV_tma.inner)
        sQ = st.sQ.get_tensor(sRow_layout)
        sDO = st.sDO.get_tensor(sRow_layout)
        sScr = st.sScr.get_tensor(sScr_layout)[None, None, wid]
        sStat = st.sStat.get_tensor(sStat_layout)[None, None, wid]

        B, T = mQ.shape[0], mQ.shape[1]
        TL, Hk = mKd.shape[1], mKd.shape[2]
        slabs = (T + P - 1) // P
        n_units = slabs * B * Hk
        gw = bidx * W + wid
        nw = nblk * W
        my_units = (n_units - gw + nw - 1) // nw  # gw < nw, so never negative
        total = my_units * NS

        thr_mma = mma.get_slice(lane)
        ld = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ld_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        cpA = cute.make_tiled_copy_A(ld, mma).get_slice(lane)
        cpB = cute.make_tiled_copy_B(ld, mma).get_slice(lane)
        cpAt = cute.make_tiled_copy_A(ld_t, mma).get_slice(lane)
        cpBt = cute.make_tiled_copy_B(ld_t, mma).get_slice(lane)
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                                         num_bits_per_copy=32), mma).get_slice(lane)
        cin = copy_in.get_slice(lane)
        cout = copy_out.get_slice(lane)

        # operand partitions (slot mode last)
        sQt, sDOt, sKt = (layout_utils.transpose_view(x) for x in (sQ, sDO, sK))
        pK_A, pV_A = cpA.partition_S(sK), cpA.partition_S(sV)  # S^T, dP^T: keys as M
        pQ_B, pDO_B = cpB.partition_S(sQ), cpB.partition_S(sDO)  # rows as N, d as K
        pDOt_B, pQt_B = cpBt.partition_S(sDOt), cpBt.partition_S(sQt)  # dV, dK: d as N, rows as K
        pKt_B = cpBt.partition_S(sKt)  # dQ: d as N, keys as K
        pScr_A = cpAt.partition_S(layout_utils.transpose_view(sScr))  # dQ: rows as M, keys as K
        rK = thr_mma.make_fragment_A(thr_mma.partition_A(sK[None, None, 0]))
        rQ = thr_mma.make_fragment_B(thr_mma.partition_B(sQ[None, None, 0]))
        rDOb = thr_mma.make_fragment_B(thr_mma.partition_B(sDO[None, None, 0]))  # dO as B operand
        rDOt = thr_mma.make_fragment_B(thr_mma.partition_B(sDOt[None, None, 0]))
        rKt = thr_mma.make_fragment_B(thr_mma.partition_B(sKt[None, None, 0]))
        rScr = thr_mma.make_fragment_A(thr_mma.partition_A(layout_utils.transpose_view(sScr)))
        cS = thr_mma.partition_C(cute.make_identity_tensor((self.step_keys, WARP_ROWS)))
        shape_S = thr_mma.partition_shape_C((self.step_keys, WARP_ROWS))
        shape_KV = thr_mma.partition_shape_C((self.step_keys, D))
        acc_dQ = cute.make_rmem_tensor(thr_mma.partition_shape_C((WARP_ROWS, D)), Float32)
        acc_dQ.fill(0.0)
        rLse = cute.make_rmem_tensor(shape_S, Float32)
        rDelta = cute.make_rmem_tensor(shape_S, Float32)
        # the next unit's o and do half-rows and lse2, loaded a step ahead (unit_stats uses them)
        rO = cute.make_rmem_tensor((D // 2,), self.dtype)
        rDO = cute.make_rmem_tensor((D // 2,), self.dtype)
        rL = cute.make_rmem_tensor((1,), Float32)
        rowc_kv = cin.partition_S(cute.make_identity_tensor((self.step_keys, D)))
        rowc_r = cin.partition_S(cute.make_identity_tensor((WARP_ROWS, D)))

        # zero this warp's buffers once: rows a step leaves unloaded (past the tensor) stay finite
        for x in (sK, sV):
            for i in cutlass.range(lane, self.step_keys * D, 32, unroll=1):
                for s in cutlass.range_constexpr(S):
                    x[i % self.step_keys, i // self.step_keys, wid * S + s] = self.dtype(0.0)
        for x in (sQ, sDO):
            for i in cutlass.range(lane, WARP_ROWS * D, 32, unroll=1):
                for s in cutlass.range_constexpr(self.rslots):
                    x[i % WARP_ROWS, i // WARP_ROWS, wid * self.rslots + s] = self.dtype(0.0)
        cute.arch.sync_warp()

        # the warp's step counters (unit k, step s, batch b, KV head j, first position t0), advanced by
        # adding the warp stride nw in the units' mixed radix (KV head, batch, slab): no division a step
        radix = (nw % Hk, (nw // Hk) % B, nw // (Hk * B) * P, B, Hk)
        cur = (Int32(0), Int32(0), *self.unit_coords(gw, B, Hk))  # unit k = 0, step s = 0: unit gw
        # prologue: steps 0 .. S-2 in flight, the first unit's o, do and lse2 in registers
        if total > 0:
            self.prefetch_stats(mO, mDO, mLSE, rO, rDO, rL, lane, cur[2], cur[3], cur[4], T)
        ld = cur
        for f in cutlass.range_constexpr(S - 1):
            if f < total:
                self.load_step(f, *ld, T, TL, mQ, mDO, mKd, mVd, sQ, sDO, sK, sV, cin, copy_in, rowc_kv, rowc_r, wid)
            cute.arch.cp_async_commit_group()
            ld = self.next_step(*ld, *radix)
        lk, ls, lb, lj, lt = ld
        k, s, b, j, t0 = cur

        for f in cutlass.range(total, unroll=1):
            if const_expr(self.tma_store):  # the slot loaded next was the last step's TMA source
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the whole warp (its store's lane among them)
                cute.arch.sync_warp()
            if f + S - 1 < total:
                self.load_step(f + S - 1, lk, ls, lb, lj, lt, T, TL, mQ, mDO, mKd, mVd, sQ, sDO, sK, sV, cin, copy_in,
                               rowc_kv, rowc_r, wid)
            lk, ls, lb, lj, lt = self.next_step(lk, ls, lb, lj, lt, *radix)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(S - 1)
            cute.arch.sync_warp()
            kslot = wid * S + f % S
            rslot = wid * self.rslots + k % self.rslots
            nk = cutlass.min(T - t0, P) * L  # the unit's depth keys
            if s == 0:
                self.unit_stats(sStat, rLse, rDelta, cS, lane, rO, rDO, rL, scale)
                acc_dQ.fill(0.0)
                if const_expr(self.keep_rows):  # the unit's q and do as B operands, held for its steps
                    vQ = cpB.retile(rQ)
                    vDO = cpB.retile(rDOb)
                    for kk in cutlass.range_constexpr(cute.size(vQ.shape[2])):
                        cute.copy(cpB, pQ_B[None, None, kk, rslot], vQ[None, None, kk])
                        cute.copy(cpB, pDO_B[None, None, kk, rslot], vDO[None, None, kk])
            if s == NS - 1 and f + 1 < total:  # the next unit's stats, hidden behind this step
                b1, j1, t1 = self.next_unit(b, j, t0, *radix)
                self.prefetch_stats(mO, mDO, mLSE, rO, rDO, rL, lane, b1, j1, t1, T)
            # P^T and dS^T (scale folded in)
            acc_S = cute.make_rmem_tensor(shape_S, Float32)
            acc_dP = cute.make_rmem_tensor(shape_S, Float32)
            acc_S.fill(0.0)
            acc_dP.fill(0.0)
            self.step_scores(thr_mma, acc_S, acc_dP, rK, rQ, rDOb, pK_A[None, None, None, kslot],
                             pV_A[None, None, None, kslot], pQ_B[None, None, None, rslot],
                             pDO_B[None, None, None, rslot], cpA, cpB, cS, rLse, rDelta, scale, scale_log2, s, nk)
            rP = fa_utils.cvt_f16(acc_S, self.dtype)
            rdS = fa_utils.cvt_f16(acc_dP, self.dtype)
            # dS^T to the scratch for dQ (read back as dS by ldmatrix.trans)
            cute.copy(r2s, r2s.retile(rdS), r2s.partition_D(sScr))
            cute.arch.sync_warp()
            row0 = t0 * L + s * self.step_keys  # the step's first depth row of (b, j)
            lim = cutlass.min(nk - s * self.step_keys, self.step_keys)
            if const_expr(self.depth_grad):
                # dV = P^T dO into the V buffer (free after dP^T), stored after the step's dQ
                acc_G = cute.make_rmem_tensor(shape_KV, Float32)
                acc_G.fill(0.0)
                sm80_helpers.gemm_rs(thr_mma, acc_G, layout_utils.reshape_acc_to_frgA(rP), rDOt,
                                     pDOt_B[None, None, None, rslot], cpBt)
                cute.copy(r2s, r2s.retile(fa_utils.cvt_f16(acc_G, self.dtype)), r2s.partition_D(sV[None, None, kslot]))
            # dQ += dS K
            sm80_helpers.gemm(thr_mma, acc_dQ, rScr, rKt, pScr_A, pKt_B[None, None, None, kslot], cpAt, cpBt)
            if const_expr(self.depth_grad):
                # dK = dS^T Q into the K buffer (free after dQ)
                acc_G = cute.make_rmem_tensor(shape_KV, Float32)
                acc_G.fill(0.0)
                sm80_helpers.gemm_rs(thr_mma, acc_G, layout_utils.reshape_acc_to_frgA(rdS), rDOt,
                                     pQt_B[None, None, None, rslot], cpBt)
                cute.arch.sync_warp()  # every lane's dQ ldmatrix of K is done
                cute.copy(r2s, r2s.retile(fa_utils.cvt_f16(acc_G, self.dtype)), r2s.partition_D(sK[None, None, kslot]))
                if const_expr(self.tma_store):
                    if lim == self.step_keys:  # a full step: its rows are the unit's alone
                        cute.arch.fence_view_async_shared()  # this lane's shared stores, visible to TMA
                        cute.arch.sync_warp()
                        # the whole warp calls the store: the DSL elects the one lane that issues it
                        for atom, src, dst in ((tma_dK, sK_tma, mDKt), (tma_dV, sV_tma, mDVt)):
                            store, _, _ = fa_copy.tma_get_copy_fn(
                                atom, 0, cute.make_layout(1), src[None, None, kslot],
                                self.depth_box(dst, b, j, row0), single_stage=True)
                            store()
                        cute.arch.cp_async_bulk_commit_group()
                    else:
                        self.store_grads(sK, sV, mDKd, mDVd, kslot, b, j, row0, cout, copy_out, rowc_kv, lim)
                else:
                    self.store_grads(sK, sV, mDKd, mDVd, kslot, b, j, row0, cout, copy_out, rowc_kv, lim)
            if s == NS - 1:
                cute.arch.sync_warp()
                cute.copy(r2s, r2s.retile(fa_utils.cvt_f16(acc_dQ, self.dtype)), r2s.partition_D(sQ[None, None, rslot]))
                cute.arch.sync_warp()
                self.store_rows(sQ[None, None, rslot], self.rows_tile(mDQ, b, j, t0), cout, copy_out, rowc_r,
                                cutlass.min(T - t0, P) * G)
            cute.arch.sync_warp()
            k, s, b, j, t0 = self.next_step(k, s, b, j, t0, *radix)
        cute.arch.cp_async_wait_group(0)
        if const_expr(self.tma_store):
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # before the CTA's shared memory goes

    # ------------------------------------------------------------------ helpers
    @cute.jit
    def step_scores(self, thr_mma, acc_S, acc_dP, rK, rQ, rDOb, sK, sV, sQ, sDO, cpA, cpB, cS, rLse, rDelta, scale,
                    scale_log2, s, nk):
        """A step's P^T = exp2(S^T scale log2e - lse2) masked to the key's own position, into acc_S, and
        dS^T = scale P^T (dP^T - delta) into acc_dP (S^T = K Q^T, dP^T = V dO^T; rDelta holds scale *
        delta). Where a step's keys are one position's (L a multiple of the step), rows past T need no
        mask (their lse2 is +inf), and at G=16 (one position a unit) no row does."""
        G, L, SK = self.G, self.L, self.step_keys
        sm80_helpers.gemm(thr_mma, acc_S, rK, rQ, sK, sQ, cpA, cpB, B_in_regs=self.keep_rows)
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            m, n = cS[i]
            p = cute.math.exp2(acc_S[i] * scale_log2 - rLse[i], fastmath=True)
            if const_expr(L % SK == 0 and G == WARP_ROWS):
                acc_S[i] = p
            elif const_expr(L % SK == 0):
                acc_S[i] = Float32(0.0)
                if s * SK // L == n // G:
                    acc_S[i] = p
            else:
                ko = s * SK + m
                acc_S[i] = Float32(0.0)
                if ko < nk and ko // L == n // G:
                    acc_S[i] = p
        sm80_helpers.gemm(thr_mma, acc_dP, rK, rDOb, sV, sDO, cpA, cpB, B_in_regs=self.keep_rows)
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            acc_dP[i] = acc_S[i] * (acc_dP[i] * scale - rDelta[i])

    @cute.jit
    def rows_tile(self, mX: cute.Tensor, b, j, t0):
        """The unit's 16 folded rows (r = t*G + g, t from t0) of (b, KV head j) as a (16, D) tensor."""
        x = cute.domain_offset((b, t0, j * self.G, 0), mX)
        return cute.make_tensor(x.iterator, cute.make_layout(((self.G, self.P), self.D),
                                                             stride=((mX.stride[2], mX.stride[1]), 1)))

    @cute.jit
    def depth_tile(self, mX: cute.Tensor, b, j, row0):
        """self.step_keys depth rows from row0 of (b, KV head j) of a (B, T*L, Hk, D) tensor."""
        x = cute.domain_offset((b, row0, j, 0), mX)
        return cute.make_tensor(x.iterator, cute.make_layout((self.step_keys, self.D), stride=(mX.stride[1], 1)))

    @staticmethod
    def rows_first(mX: cute.Tensor) -> cute.Tensor:
        """A (B, T*L, Hk, D) tensor viewed (T*L, D, Hk, B): the modes a TMA box tiles come first."""
        return cute.make_tensor(mX.iterator, cute.select(mX.layout, mode=[1, 3, 2, 0]))

    @cute.jit
    def depth_box(self, mT: cute.Tensor, b, j, row0):
        """The TMA box of a step's depth rows from row0 of (b, KV head j): a (step_keys, D) tile of
        the (T*L, D, Hk, B) TMA coordinate tensor (`rows_first`)."""
        x = cute.domain_offset((row0, 0, 0, 0), mT)[None, None, j, b]
        return cute.local_tile(x, (self.step_keys, self.D), (0, 0))

    @cute.jit
    def unit_coords(self, u, B, Hk):
        """Unit u's batch, KV head and first position (units KV head fastest, then batch, then slab of
        P positions), by division: the kernel decodes a warp's first unit so and advances from there
        (`next_unit`)."""
        slab = u // (B * Hk)
        bh = u - slab * (B * Hk)
        return bh // Hk, bh - (bh // Hk) * Hk, slab * self.P

    @cute.jit
    def next_unit(self, b, j, t0, nj, nb, nt0, B, Hk):
        """The warp's next unit (its unit index plus nw, whose digits are nj, nb, nt0 / P)."""
        j = j + nj
        b = b + nb
        t0 = t0 + nt0
        if j >= Hk:
            j = j - Hk
            b = b + 1
        if b >= B:
            b = b - B
            t0 = t0 + self.P
        return b, j, t0

    @cute.jit
    def next_step(self, k, s, b, j, t0, nj, nb, nt0, B, Hk):
        """The counters of the warp's next flat step."""
        s = s + 1
        if s == self.steps:
            s = Int32(0)
            k = k + 1
            b, j, t0 = self.next_unit(b, j, t0, nj, nb, nt0, B, Hk)
        return k, s, b, j, t0

    @cute.jit
    def load_step(self, f, k, s, b, j, t0, T, TL, mQ, mDO, mKd, mVd, sQ, sDO, sK, sV, cin, copy_in, rowc_kv, rowc_r,
                  wid):
        """cp.async of flat step f's depth K and V rows (and, at a unit's first step, its q and do rows);
        (k, s, b, j, t0) its counters."""
        S, P, L = self.stages, self.P, self.L
        if s == 0:
            rlim = cutlass.min(T - t0, P) * self.G
            for src, dst in ((mQ, sQ), (mDO, sDO)):
                self.copy_rows(copy_in, cin.partition_S(self.rows_tile(src, b, j, t0)),
                               cin.partition_D(dst[None, None, wid * self.rslots + k % self.rslots]), rowc_r, rlim)
        row0 = t0 * L + s * self.step_keys
        klim = TL - row0
        for src, dst in ((mKd, sK), (mVd, sV)):
            self.copy_rows(copy_in, cin.partition_S(self.depth_tile(src, b, j, row0)),
                           cin.partition_D(dst[None, None, wid * S + f % S]), rowc_kv, klim)

    @cute.jit
    def prefetch_stats(self, mO, mDO, mLSE, rO, rDO, rL, lane, b, j, t0, T):
        """Issue the loads of a unit's o and do half-rows (lane: row lane // 2, half lane % 2) and its
        lse2 (+inf past T; o = do = 0 there) into registers; `unit_stats` reduces them a step later."""
        G, D = self.G, self.D
        r = lane // 2
        t = t0 + r // G
        rL[0] = Float32(float("inf"))
        rO.fill(0.0)
        rDO.fill(0.0)
        if t < T:
            for src, dst in ((mO, rO), (mDO, rDO)):
                cute.autovec_copy(cute.local_tile(self.rows_tile(src, b, j, t0)[r, None], (D // 2,), (lane % 2,)), dst)
            rL[0] = mLSE[b, t, j * G + r % G] * LOG2E

    @cute.jit
    def unit_stats(self, sStat, rLse, rDelta, cS, lane, rO, rDO, rL, scale):
        """lse2 (+inf past T) and scale * delta (delta = rowsum(o*do)) of the unit's rows, from the
        registers `prefetch_stats` loaded, into this thread's fragments."""
        r = lane // 2
        dot = (rO.load().to(Float32) * rDO.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        dot = dot + cute.arch.shuffle_sync_bfly(dot, offset=1)
        if lane % 2 == 0:
            sStat[r, 0] = rL[0]
            sStat[r, 1] = dot
        cute.arch.sync_warp()
        for i in cutlass.range_constexpr(cute.size(rLse)):
            n = cS[i][1]
            rLse[i] = sStat[n, 0]
            rDelta[i] = sStat[n, 1] * scale

    @cute.jit
    def store_grads(self, sK, sV, mDKd, mDVd, kslot, b, j, row0, cout, copy_out, rowc, lim):
        """A step's dK and dV rows [0, lim) from its K and V buffers by vector stores (a step that is
        not full, or tma_store off)."""
        cute.arch.sync_warp()
        self.store_rows(sK[None, None, kslot], self.depth_tile(mDKd, b, j, row0), cout, copy_out, rowc, lim)
        self.store_rows(sV[None, None, kslot], self.depth_tile(mDVd, b, j, row0), cout, copy_out, rowc, lim)

    @cute.jit
    def store_rows(self, src_s, dst_g, cout, copy_out, rowc, lim):
        """Rows [0, lim) of a shared tile to global memory, 16 bytes a thread a copy."""
        s = cout.partition_S(src_s)
        d = cout.partition_D(dst_g)
        r = cute.make_fragment_like(s)
        cute.autovec_copy(s, r)
        self.copy_rows(copy_out, r, d, rowc, lim)

    @cute.jit
    def copy_rows(self, copy, src, dst, rowc, lim):
        """The row iterations n of a tiled copy's partitions whose row (`rowc`, the identity tile's
        partition) is below `lim`."""
        for n in cutlass.range_constexpr(cute.size(src, mode=[1])):
            if rowc[0, n, 0][0] < lim:
                cute.copy(copy, src[None, n, None], dst[None, n, None])


# ---------------------------------------------------------------------- host side
_COMPILED: dict = {}


def _compiled(args, scale: float, programs: int, G: int, L: int, warps: int, stages: int, depth_grad: bool,
              step_keys: int = STEP_KEYS, keep_rows: bool = True, tma_store: bool = True):
    q = args[0]
    tma_store = tma_store and depth_grad  # nothing to store without depth_grad: one kernel either way
    key = (q.dtype, q.shape[3], G, L, warps, stages, depth_grad, step_keys, keep_rows, tma_store)
    if key not in _COMPILED:
        dtype = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[q.dtype]
        kern = DepthBwdSm90(dtype, q.shape[3], G, L, warps=warps, stages=stages, depth_grad=depth_grad,
                            step_keys=step_keys, keep_rows=keep_rows, tma_store=tma_store)
        cargs = [to_cute_tensor(t) for t in args[:3]]
        cargs.append(to_cute_tensor(args[3], assumed_align=4))
        cargs += [to_cute_tensor(t) for t in args[4:]]
        _COMPILED[key] = cute.compile(kern, *cargs, scale, programs,
                                      cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                                      options="--enable-tvm-ffi")
    return _COMPILED[key]


def depth_bwd_sm90(do, q, o, lse, kd, vd, scale: float, G: int, programs: int, *, depth_grad: bool = True,
                   warps: int = 8, stages: int = 2, step_keys: int = STEP_KEYS, keep_rows: bool = True,
                   tma_store: bool = True):
    """(dq share (q's dtype), dk_depth, dv_depth) given the merged o and lse (B,T,Hq) fp32; dk_depth =
    dv_depth = None without depth_grad. `programs` CTAs of `warps` independent warps. Same contract as
    `kernel_depth.depth_bwd`; `unavailable` says which inputs it cannot take."""
    why = unavailable(q, kd, G)
    if why:
        raise ValueError(why)
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    kdv, vdv = kd.reshape(B, T * L, Hk, d), vd.reshape(B, T * L, Hk, d)
    dq = torch.empty_like(q)
    dkd = torch.empty_like(kd) if depth_grad else None
    dvd = torch.empty_like(vd) if depth_grad else None
    gk = dkd.view(B, T * L, Hk, d) if depth_grad else kdv  # never written without depth_grad
    gv = dvd.view(B, T * L, Hk, d) if depth_grad else vdv
    args = (q, do, o, lse, kdv, vdv, dq, gk, gv)
    n_units = -(-T // (WARP_ROWS // G)) * B * Hk
    programs = max(1, min(programs, -(-n_units // warps)))
    _compiled(args, float(scale), programs, G, L, warps, stages, depth_grad, step_keys, keep_rows,
              tma_store)(*args, float(scale), programs)
    return dq, dkd, dvd
