"""The depth steps of the fused sm90 forward: how a tile's depth keys join its softmax.

Owns: `DepthSteps`, the mixin of `fused_sm90.MoDAForwardSm90` that scores a consumer group's depth
keys, in two forms:
* block steps ("offset", "first"): a group's depth keys in `depth_tile`-row blocks, each scored
  against all 64 rows of the group by FA4's own overlapped wgmma block step, masked
  block-diagonally (at G=8 a product is 7/8 masked), run back to back as one phase of the tile;
* warp steps ("spread"): each warp's 16 rows against `depth_tile` (16 or 32, by default 32) of its
  own depth keys at a time with mma.sync (m16n8k16), interleaved one by one
  between the tile's sequence blocks, so that the producer streams the depth bytes while the
  sequence blocks compute. A warp step changes nothing of FA4's QK/P.V chain: it runs after a
  block's softmax, rescales O and the pending P of that block when the row maximum grows, and
  adds its P.V to O in place (mma.sync's C fragment is the wgmma C fragment of the same rows).
  At d = 64 its operands come from ldmatrix at addresses computed in the step from the thread
  index by a few bit operations, the other chunks as XOR constants (`lane_rows`): CuTe's
  partitions cost about 140 integer instructions a step there (probe "cuteaddr" keeps them).
  At G=8 (two positions a warp) and L a multiple of 16 the steps are "paired" (`paired`): a
  32-key step holds 16 keys of each position, scored into two accumulators whose own rows are
  kept, so no score row is masked and the softmax does half the work a step (probe "unpaired"
  keeps the one-position steps, half of whose rows are masked).
Both continue the tile's one online softmax; nothing is merged afterwards.
Also the placement policy: which placement, warp tile and stage count a shape gets by default.
Imported only where FA4 imports (this module needs cutlass).
"""

from functools import partial

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import T, dsl_user_op
from flash_attn.cute import ampere_helpers as sm80_helpers
from flash_attn.cute import utils as fa_utils
from quack import layout_utils

ROWS_PER_GROUP = 64  # rows of one consumer warp group (one wgmma M)
WARP_ROWS = 16  # rows of one warp (one mma.sync M)
WARP_KEYS = (16, 32)  # depth keys of one warp step (the K of its P.V: one or two mma.sync K)
PLACEMENTS = ("offset", "first", "spread")  # where a tile's depth steps go among its sequence blocks
# variants (MoDAForwardSm90.__init__)
PROBES = ("", "rows0", "nomath", "late", "noqk", "nomask", "nopv", "cellmask", "cuteaddr", "unpaired")
ROW_BYTES = 128  # a 64-wide bf16 row of the shared tiles: one 128-byte swizzle row (Swizzle<3,4,3> on bytes)
SWIZZLE_ROWS = 8  # rows of one swizzle period (1024 bytes); offsets by whole periods commute with the swizzle
ROWS16_BYTES = 2 * SWIZZLE_ROWS * ROW_BYTES  # the next 16 rows of a tile: two whole swizzle periods further


@dsl_user_op
def opaque_thread_idx(*, loc=None, ip=None) -> Int32:
    """threadIdx.x read by a volatile asm: the compiler cannot hoist what depends on it out of the
    sequence loop, so a warp step's addresses are computed in the step and hold no registers
    across the loop (hoisted, they made the loop spill)."""
    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %tid.x;", "=r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def ldsm_x4(addr: Int32, trans: bool, *, loc=None, ip=None):
    """ldmatrix .x4 (four 8x8 b16 matrices, `trans`: each transposed) from the shared-memory byte address
    this lane supplies: four b32 registers, matrix i's fragment in register i. Volatile, so that it
    stays after the pipeline wait that makes its stage valid and inside the step (not hoisted)."""
    op = "ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") + ".shared.b16"
    res = llvm.inline_asm(ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>"), [Int32(addr).ir_value(loc=loc, ip=ip)],
                          op + " {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", has_side_effects=True,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


def ldsm_into(frag32, first: int, addr, trans: bool):
    """An .x4 ldmatrix from `addr` into four consecutive b32 registers of a fragment from `first`."""
    regs = ldsm_x4(addr, trans)
    for j in range(4):
        frag32[first + j] = regs[j]


class DepthSteps:
    """Mixin: the depth steps of `MoDAForwardSm90` (block and warp forms, see module)."""

    # ------------------------------------------------------------------ block steps (wgmma)
    @cute.jit
    def depth_mask(self, acc_S, n_block, thr_mma, group, mask_seqlen=None):
        """-inf where the depth row's position is not the score row's (same group, see module);
        n_block is the depth step. Where L is a multiple of depth_tile, row by row."""
        coords = layout_utils.reshape_acc_to_mn(
            thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.depth_tile))))
        acc = layout_utils.reshape_acc_to_mn(acc_S)
        if const_expr(self.depth_len % self.depth_tile == 0 and self.probe != "cellmask"):
            # the step's keys are one position's: a score row is all in or all out
            live = n_block * self.depth_tile // self.depth_len
            for r in cutlass.range_constexpr(cute.size(acc, mode=[0])):
                if (coords[r, 0][0] - group * ROWS_PER_GROUP) // self.qhead_per_kvhead != live:
                    for c in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                        acc[r, c] = -Float32.inf
        else:
            for r in cutlass.range_constexpr(cute.size(acc, mode=[0])):
                pos = (coords[r, 0][0] - group * ROWS_PER_GROUP) // self.qhead_per_kvhead
                lo = pos * self.depth_len - n_block * self.depth_tile
                for c in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                    col = coords[r, c][1]
                    if col < lo or col >= lo + self.depth_len:
                        acc[r, c] = -Float32.inf

    def group_gemm(self, gemm, group, B_idx, **kw):
        """A depth product on this group's block of the stage (buffer stage * groups + group)."""
        return gemm(B_idx=B_idx * (self.tile_m // ROWS_PER_GROUP) + group, **kw)

    @cute.jit
    def depth_phase(self, d_state, start: cutlass.Constexpr, mma_qk_d, mma_pv_d, pipeline_kd, pipeline_vd,
                    tOrPd, softmax, seqlen, acc_O, mask_d, no_smem_p):
        """All depth steps of the tile as FA4's own overlapped block steps (QK of step s beside P.V of
        step s-1, the groups taking turns): `start` begins the softmax and O (first thing of the
        tile), else it continues them (no P.V pending). Ends with no P.V pending."""
        if const_expr(self.probe == "nomath"):
            for s in cutlass.range(self.depth_steps, unroll=1):
                for pipe in (pipeline_kd, pipeline_vd):
                    pipe.consumer_wait(d_state, pipe.consumer_try_wait(d_state))
                    pipe.consumer_release(d_state)
                d_state.advance()
            if const_expr(start):
                softmax.reset()
                acc_O.fill(0.0)
            return d_state
        if const_expr(start):
            d_state = self.first_half_block_overlap(0, mma_qk_d, d_state, pipeline_kd, tOrPd, no_smem_p, softmax,
                                                    seqlen, mask_fn=mask_d, is_first_block=True)
        else:
            d_state = self.continue_block(d_state, 0, mma_qk_d, pipeline_kd, tOrPd, softmax, acc_O, mask_d)
        O_acc = not start
        for s in cutlass.range(1, self.depth_steps, unroll=1):
            d_state = self.mma_one_n_block_intrawg_overlap(
                d_state, s, mma_qk_d, partial(mma_pv_d, zero_init=not O_acc), pipeline_kd, pipeline_vd, acc_O,
                tOrPd, no_smem_p, softmax, seqlen, mask_fn=mask_d, check_inf=True)
            O_acc = True
        return self.last_half_block_overlap(d_state, pipeline_vd, mma_pv_d, zero_init=not O_acc)

    @cute.jit
    def continue_block(self, kv_state, n_block, mma_qk, pipeline_k, tOrP, softmax, acc_O, mask_fn):
        """QK of one sequence block that continues a running softmax (no P.V pending): FA4's first
        half-block, but rescaling O instead of starting the softmax afresh."""
        pipeline_k.consumer_wait(kv_state, pipeline_k.consumer_try_wait(kv_state))
        acc_S = mma_qk(B_idx=kv_state.index, wg_wait=0)
        pipeline_k.consumer_release(kv_state)
        if const_expr(mask_fn is not None):
            mask_fn(acc_S, n_block=n_block)
        row_scale = softmax.online_softmax(acc_S, is_first=False, check_inf=True)
        softmax.rescale_O(acc_O, row_scale)
        fa_utils.cvt_f16(layout_utils.reshape_acc_to_frgA(acc_S), tOrP)
        return kv_state

    # ------------------------------------------------------------------ warp steps (mma.sync)
    def warp_depth_mmas(self):
        """The mma.sync tiled MMAs of one consumer group (4 warps along M), for QK (64 x depth_tile
        keys) and P.V (64 x d)."""
        def tiled():
            return cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (4, 1, 1),
                                       permutation_mnk=(ROWS_PER_GROUP, 16, 16))
        return tiled(), tiled()

    @cute.jit
    def warp_depth_setup(self, tiled_qk, tiled_pv, group, sQ, sKd, sVd, acc_O):
        """This thread's operands of the warp steps: the group's Q rows (A), the warp's depth K and
        V buffers (B, indexed by buffer), ldmatrix copies, and O viewed as mma.sync's C fragment."""
        lane = opaque_thread_idx() % 128
        thr_qk = tiled_qk.get_slice(lane)
        thr_pv = tiled_pv.get_slice(lane)
        sQg = cute.local_tile(sQ, (ROWS_PER_GROUP, self.tile_hdim), (group, 0))
        sVdt = layout_utils.transpose_view(sVd)
        ld = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ld_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        copy_q = cute.make_tiled_copy_A(ld, tiled_qk).get_slice(lane)
        copy_k = cute.make_tiled_copy_B(ld, tiled_qk).get_slice(lane)
        copy_v = cute.make_tiled_copy_B(ld_t, tiled_pv).get_slice(lane)
        acc_O_w = cute.make_tensor(acc_O.iterator,
                                   cute.make_layout(thr_pv.partition_shape_C((ROWS_PER_GROUP, self.tile_hdimv))))
        return dict(
            thr_qk=thr_qk, thr_pv=thr_pv, copy_q=copy_q, copy_k=copy_k, copy_v=copy_v, acc_O=acc_O_w,
            rQ=thr_qk.make_fragment_A(thr_qk.partition_A(sQg)),
            rK=thr_qk.make_fragment_B(thr_qk.partition_B(sKd[None, None, 0])),
            rVt=thr_pv.make_fragment_B(thr_pv.partition_B(sVdt[None, None, 0])),
            sQ=copy_q.partition_S(sQg), sK=copy_k.partition_S(sKd), sVt=copy_v.partition_S(sVdt),
            coords=self.score_coords(tiled_qk, thr_qk),
        )

    def score_coords(self, tiled_qk, thr_qk=None):
        """(row, key) of each of this thread's warp-step scores, rows by columns (the mask's view)."""
        thr_qk = tiled_qk.get_slice(opaque_thread_idx() % 128) if thr_qk is None else thr_qk
        return layout_utils.reshape_acc_to_mn(
            thr_qk.partition_C(cute.make_identity_tensor((ROWS_PER_GROUP, self.depth_tile))))

    def raw_operands(self) -> bool:
        """Whether the warp steps load their operands by hand-addressed ldmatrix (`warp_qk`, `warp_pv`):
        64-wide rows (one 128-byte swizzle row each); the probe "cuteaddr" keeps CuTe's copies."""
        return self.tile_hdim == 64 and self.tile_hdimv == 64 and self.probe != "cuteaddr"

    def paired(self) -> bool:
        """Whether a warp step scores its two positions' keys side by side ("paired"): at G=8 a
        warp's 16 rows are two positions (rows 0-7 and 8-15) and a 32-key step holds 16 keys of
        each (buffer rows 0-15 and 16-31, two 16-row TMA boxes). QK scores all 16 rows against each
        half into its own accumulator and keeps that half's rows; P.V runs once a half with the
        other half's rows of P zeroed. The 16 x 16 scores are all live: the same mma.sync count as
        a 32-key step of one position, with no mask and half the softmax and conversion work a step
        (an unpaired step masks half its rows).
        Needs the hand-addressed operands and L a multiple of 16; the probe "unpaired" keeps the
        one-position steps."""
        return (self.placement == "spread" and self.raw_operands() and self.qhead_per_kvhead * 2 == WARP_ROWS
                and self.depth_tile == 32 and self.depth_len % (self.depth_tile // 2) == 0
                and self.probe not in ("unpaired", "cellmask"))

    def step_keys(self) -> int:
        """Score columns of a warp step: depth_tile, or 16 (a key of each position) when paired."""
        return self.depth_tile // 2 if self.paired() else self.depth_tile

    @cute.jit
    def lane_rows(self, group, sQ, sKd, sVd, buf):
        """This lane's ldmatrix row addresses (shared-memory bytes, swizzled) of a warp step: the
        Q row of its first k-chunk, the depth K and V rows of its first chunk in buffer `buf`, and
        its score rows' index in the warp (lane // 4; the other is 8 more).
        Q (A operand) and V (transposed B) follow matrix i = lane // 8 of an .x4 load at row
        lane % 16 and chunk lane // 16; K (B) at key (lane // 16) * 8 + lane % 8 and chunk
        (lane // 8) % 2. Every row's swizzle phase is lane % 8. The other chunks are an XOR of the
        chunk bits (chunk c + 2j: XOR 32 j bytes), the other 16-row blocks an added 2048 bytes
        (two swizzle periods), both applied by `warp_qk` and `warp_pv` as constants."""
        # bit operations throughout: a signed % or // costs sign fix-ups (the thread index is >= 0)
        tid = opaque_thread_idx()
        lane = tid & 31
        phase = lane & 7
        row_qv = lane & 15
        chunk_qv = ((lane >> 4) ^ phase) << 4
        row_q = group * ROWS_PER_GROUP + ((tid >> 5) & 3) * WARP_ROWS + row_qv
        q_addr = sQ.iterator.toint() + row_q * ROW_BYTES + chunk_qv
        buf_bytes = buf * (self.depth_tile * ROW_BYTES)
        v_addr = sVd.iterator.toint() + buf_bytes + row_qv * ROW_BYTES + chunk_qv
        row_k = ((lane >> 4) << 3) + phase
        k_addr = sKd.iterator.toint() + buf_bytes + row_k * ROW_BYTES + ((((lane >> 3) & 1) ^ phase) << 4)
        return q_addr, k_addr, v_addr, cutlass.Uint32(lane >> 2)

    @cute.jit
    def warp_qk(self, tiled_qk, q_addr, k_addr, acc):
        """S += Q_w K_d^T from hand-addressed ldmatrix loads into CuTe's mma.sync fragments (their
        register order is CuTe's partition order: A ((2,2,2),1,k) and B ((2,2),n,k) with 8-key
        n-atoms in order, the i-th b32 of an .x4 load being matrix i's fragment)."""
        rQ = tiled_qk.make_fragment_A(tiled_qk.partition_shape_A((ROWS_PER_GROUP, self.tile_hdim)))
        rK = tiled_qk.make_fragment_B(tiled_qk.partition_shape_B((self.depth_tile, self.tile_hdim)))
        rQ32, rK32 = cute.recast_tensor(rQ, Int32), cute.recast_tensor(rK, Int32)
        for kk in cutlass.range_constexpr(self.tile_hdim // 16):
            ldsm_into(rQ32, 4 * kk, q_addr ^ (kk * 32), False)
            for npair in cutlass.range_constexpr(self.depth_tile // 16):
                ldsm_into(rK32, 8 * kk + 4 * npair, (k_addr ^ (kk * 32)) + npair * ROWS16_BYTES, False)
            cute.gemm(tiled_qk, acc, rQ[None, None, kk], rK[None, None, kk], acc)

    @cute.jit
    def warp_pv(self, tiled_pv, v_addr, rP, acc_O):
        """O += P_d V_d from hand-addressed transposed ldmatrix loads (B fragment ((2,2),n,k): n-atoms
        of 8 columns of d, k-steps of 16 keys). In a paired step (`paired`) P's rows 0-7 go against
        buffer keys 0-15 and rows 8-15 against keys 16-31: P's A registers 0 and 2 hold rows 0-7 (of
        the low and high 8 keys), 1 and 3 rows 8-15, and each half's product takes P with the other
        half's registers zeroed (`paired_halves`)."""
        rV = tiled_pv.make_fragment_B(tiled_pv.partition_shape_B((self.tile_hdimv, self.depth_tile)))
        rV32 = cute.recast_tensor(rV, Int32)
        rPA = layout_utils.reshape_acc_to_frgA(rP)
        rPk = self.paired_halves(rPA) if const_expr(self.paired()) else [rPA[None, None, ks] for ks in
                                                                          range(self.depth_tile // 16)]
        for ks in cutlass.range_constexpr(self.depth_tile // 16):
            for dpair in cutlass.range_constexpr(self.tile_hdimv // 16):
                ldsm_into(rV32, 16 * ks + 4 * dpair, (v_addr ^ (dpair * 32)) + ks * ROWS16_BYTES, True)
            cute.gemm(tiled_pv, acc_O, rPk[ks], rV[None, None, ks], acc_O)

    @cute.jit
    def paired_halves(self, rPA):
        """P's A fragment (one 16-key k-step) as two: rows 0-7 only, then rows 8-15 only."""
        rP32 = cute.recast_tensor(rPA, Int32)
        rPh = [cute.make_fragment_like(rPA) for _ in range(2)]
        zero = Int32(0)
        for h in cutlass.range_constexpr(2):
            h32 = cute.recast_tensor(rPh[h], Int32)
            for j in cutlass.range_constexpr(4):
                h32[j] = rP32[j] if j % 2 == h else zero
        return [x[None, None, 0] for x in rPh]

    @cute.jit
    def warp_qk_paired(self, tiled_qk, q_addr, k_addr, acc):
        """S = Q_w K_d^T of a paired step (`paired`): rows 0-7 against buffer keys 0-15 (their
        position's), rows 8-15 against keys 16-31. Each half of the keys is scored against all 16
        rows into its own accumulator; S takes rows 0-7 of the first and rows 8-15 of the second
        (the other rows, scores against the other position's keys, are dropped)."""
        half = self.depth_tile // 2
        rQ = tiled_qk.make_fragment_A(tiled_qk.partition_shape_A((ROWS_PER_GROUP, self.tile_hdim)))
        rK = [tiled_qk.make_fragment_B(tiled_qk.partition_shape_B((half, self.tile_hdim))) for _ in range(2)]
        rQ32 = cute.recast_tensor(rQ, Int32)
        rK32 = [cute.recast_tensor(x, Int32) for x in rK]
        acc_b = cute.make_fragment_like(acc)
        acc_b.fill(0.0)
        accs = (acc, acc_b)
        for kk in cutlass.range_constexpr(self.tile_hdim // 16):
            ldsm_into(rQ32, 4 * kk, q_addr ^ (kk * 32), False)
            for h in cutlass.range_constexpr(2):
                ldsm_into(rK32[h], 4 * kk, (k_addr ^ (kk * 32)) + h * ROWS16_BYTES, False)
                cute.gemm(tiled_qk, accs[h], rQ[None, None, kk], rK[h][None, None, kk], accs[h])
        a_mn, b_mn = layout_utils.reshape_acc_to_mn(acc), layout_utils.reshape_acc_to_mn(acc_b)
        for c in cutlass.range_constexpr(cute.size(a_mn, mode=[1])):
            a_mn[1, c] = b_mn[1, c]  # rows 8-15 (this thread's second row)

    @cute.jit
    def warp_mask(self, acc_S, step, coords, row16=None):
        """-inf where the warp's depth key is not of the score row's position: the warp's keys are
        its positions' L keys each, in order, depth_tile a step (where L is a multiple of depth_tile,
        row by row: 2 instructions a row instead of 2 a score). The row-wise form takes the score
        rows from `row16` (lane // 4) where given, else from `coords`."""
        acc = layout_utils.reshape_acc_to_mn(acc_S)
        if const_expr(self.depth_len % self.depth_tile == 0 and self.probe != "cellmask"):
            # a step's keys are one position's: a score row is all in or all out (none out at G=16)
            if const_expr(self.qhead_per_kvhead < WARP_ROWS):
                pos = cutlass.Uint32(step) // (self.depth_len // self.depth_tile)  # steps count from 0
                for r in cutlass.range_constexpr(cute.size(acc, mode=[0])):
                    row = (row16 + 8 * r) if const_expr(row16 is not None) else coords[r, 0][0] % WARP_ROWS
                    if row // self.qhead_per_kvhead != pos:
                        for c in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                            acc[r, c] = -Float32.inf
        else:
            for r in cutlass.range_constexpr(cute.size(acc, mode=[0])):
                lo = (coords[r, 0][0] % WARP_ROWS) // self.qhead_per_kvhead * self.depth_len - step * self.depth_tile
                for c in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                    col = coords[r, c][1]
                    if col < lo or col >= lo + self.depth_len:
                        acc[r, c] = -Float32.inf

    @cute.jit
    def rescale_pending_P(self, tOrP, row_scale, acc_shape_S):
        """Scale the rows of a sequence block's P (bf16, waiting for its P.V) like O."""
        tmp = cute.make_rmem_tensor(acc_shape_S, Float32)
        tmp_frgA = layout_utils.reshape_acc_to_frgA(tmp)
        tmp_frgA.store(tOrP.load().to(Float32))
        tmp_mn = layout_utils.reshape_acc_to_mn(tmp)
        for r in cutlass.range_constexpr(cute.size(row_scale)):
            tmp_mn[r, None].store(tmp_mn[r, None].load() * row_scale[r])
        fa_utils.cvt_f16(tmp_frgA, tOrP)

    @cute.jit
    def warp_step(self, w_args, d_state, step, buf, pipeline_kd, pipeline_vd, softmax, acc_O, tOrP,
                  acc_shape_S, pending: cutlass.Constexpr):
        """One warp step: S = Q_w K_d^T (16 rows x depth_tile keys), mask, the online softmax, O and a
        pending P rescaled, O += P_d V_d. `buf` is this warp's buffer of the stage. Timing probes
        (wrong results) leave out a part: "nomath" all of it, "noqk" the QK product (S = 0),
        "nomask" the mask, "nopv" the P.V product."""
        if const_expr(self.probe == "nomath"):
            for pipe in (pipeline_kd, pipeline_vd):
                pipe.consumer_wait(d_state, pipe.consumer_try_wait(d_state))
                pipe.consumer_release(d_state)
        else:
            tiled_qk, tiled_pv = w_args[0], w_args[1]
            coords, row16 = None, None
            if const_expr(self.raw_operands()):  # the operands by hand-addressed ldmatrix
                q_addr, k_addr, v_addr, row16 = self.lane_rows(*w_args[2:6], buf)
                paired = const_expr(self.paired())
                acc_O_w = cute.make_tensor(acc_O.iterator, cute.make_layout(
                    tiled_pv.partition_shape_C((ROWS_PER_GROUP, self.tile_hdimv))))
                qk = partial(self.warp_qk_paired if paired else self.warp_qk, tiled_qk, q_addr, k_addr)
                pv = partial(self.warp_pv, tiled_pv, v_addr, acc_O=acc_O_w)
            else:  # CuTe's partitions and copies (probe "cuteaddr", or d < 64)
                w = self.warp_depth_setup(*w_args)
                coords = w["coords"]
                qk = partial(sm80_helpers.gemm, w["thr_qk"], tCrA=w["rQ"], tCrB=w["rK"], tCsA=w["sQ"],
                             tCsB=w["sK"][None, None, None, buf], smem_thr_copy_A=w["copy_q"],
                             smem_thr_copy_B=w["copy_k"])

                def pv(rP):
                    return sm80_helpers.gemm_rs(w["thr_pv"], w["acc_O"], layout_utils.reshape_acc_to_frgA(rP), w["rVt"],
                                                w["sVt"][None, None, None, buf], w["copy_v"])

            acc_S = cute.make_rmem_tensor(tiled_qk.partition_shape_C((ROWS_PER_GROUP, self.step_keys())), Float32)
            acc_S.fill(0.0)
            pipeline_kd.consumer_wait(d_state, pipeline_kd.consumer_try_wait(d_state))
            if const_expr(self.probe != "noqk"):
                qk(acc=acc_S)
            pipeline_kd.consumer_release(d_state)
            if const_expr(self.probe != "nomask" and not self.paired()):  # a paired step's scores are all live
                if const_expr(coords is None and (self.depth_len % self.depth_tile != 0 or self.probe == "cellmask")):
                    coords = self.score_coords(tiled_qk)  # the score-by-score mask needs each score's column
                self.warp_mask(acc_S, step, coords, row16)
            self.warp_softmax_pv(acc_S, softmax, acc_O, tOrP, acc_shape_S, pending, pipeline_vd, d_state, pv)
        d_state.advance()
        return d_state

    @cute.jit
    def warp_softmax_pv(self, acc_S, softmax, acc_O, tOrP, acc_shape_S, pending: cutlass.Constexpr, pipeline_vd,
                        d_state, pv):
        """The rest of a warp step after its masked scores: the online softmax, O and a pending P
        rescaled where the row maximum grew, then `pv(P)` (O += P_d V_d) once the stage's V is in."""
        row_scale = softmax.online_softmax(acc_S, is_first=False, check_inf=True)
        if row_scale[0] < 1.0 or row_scale[1] < 1.0:  # the row maximum grew (rare after a few blocks)
            softmax.rescale_O(acc_O, row_scale)
            if const_expr(pending):
                self.rescale_pending_P(tOrP, row_scale, acc_shape_S)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        fa_utils.cvt_f16(acc_S, rP)
        pipeline_vd.consumer_wait(d_state, pipeline_vd.consumer_try_wait(d_state))
        if const_expr(self.probe != "nopv"):
            pv(rP)
        pipeline_vd.consumer_release(d_state)

    @cute.jit
    def spread_steps(self, w, d_state, done, due, pipeline_kd, pipeline_vd, softmax, acc_O,
                     tOrP, acc_shape_S, pending: cutlass.Constexpr):
        """The warp steps from `done` up to `due`; returns the pipeline state and the new count."""
        units = self.tile_m // WARP_ROWS
        while done < due:
            # this warp's buffer of the stage: consumer warps are the CTA's warps 4.. (unit = warp - 4)
            unit = cute.arch.make_warp_uniform((opaque_thread_idx() >> 5) - 4)
            buf = d_state.index * units + unit
            d_state = self.warp_step(w, d_state, done, buf, pipeline_kd, pipeline_vd, softmax, acc_O, tOrP,
                                     acc_shape_S, pending)
            done += 1
        return d_state, done


def placement_unavailable(placement: str, d: int) -> str | None:
    """Why the kernel cannot run `placement` at head size d (None: it can)."""
    if placement not in PLACEMENTS:
        return f"placement must be one of {PLACEMENTS}, got {placement!r}"
    if placement == "spread" and d > 64:
        return "placement 'spread' needs d <= 64 (its per-warp depth stages do not fit shared memory at d=128)"
    return None


def default_placement(T: int, d: int = 64) -> str:
    """Where a tile's depth steps go by default: "spread" at d <= 64 (at every length), else
    "offset". "spread" was the fastest placement at every measured length with the hand-addressed
    warp steps, and "offset" beat "first" everywhere (docs/DESIGN.md, "The fused sm90 forward").
    T is kept for a length rule."""
    return "spread" if d <= 64 else "offset"


def default_depth_tile(d: int, placement: str = "offset") -> int:
    """Depth rows per group and stage: 64 at d <= 64; 32 at d = 128 (shared memory); per warp 32
    for "spread" (32 keys in one stage ran faster than 16 in two; docs/DESIGN.md, "The fused sm90
    forward")."""
    if placement == "spread":
        return 32
    return 64 if d <= 64 else 32


def default_depth_stages(placement: str) -> int:
    """Depth stages: 2, and 1 for "spread", whose 32-key warp stages fill the shared memory and
    are loaded while the chunk of sequence blocks before their step runs."""
    return 1 if placement == "spread" else 2
