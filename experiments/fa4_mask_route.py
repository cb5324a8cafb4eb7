"""The "mask route" for MoDA on FlashAttention-4: a prototype to compare with `moda_fa4` (the
merge route) and plain FA4. Needs an sm90/sm100 GPU with flash-attn-4; not run in CI.

MoDA as ONE FA4 call: the sequence keys and the depth keys are concatenated into one key
sequence of length T + T*L (key T + t*L + l is depth entry l of position t; the concatenation is
timed as part of the call, its backward too), and a FA4 `mask_mod` lets query t see the
sequence keys <= t and its own L depth keys. Variants:
  mask-sparse  mask_mod + block-sparse tensors (forward: for each 128-query block the 128-key
               blocks it sees, "full" ones apart so they skip the mask; backward: the transpose),
               built here with torch from the layout (`flash_attn.cute.compute_block_sparsity`
               only builds the forward's, by evaluating the mask on every (query, key) pair);
  mask-dense   mask_mod alone: FA4 visits every key block (T * (T + T*L) logits; only run for
               T <= --dense-max-T);
  moda-fa4     moda_bench.kernels.moda.fa4.merge.moda_fa4 (FA4 + our depth-only Triton launches + merge);
  fa4          FA4 on the sequence part alone (no depth): the floor.
Cost model of mask-sparse (why it should lose): a 128-row query block's depth keys are
128*L contiguous keys, i.e. L key blocks, of which each row uses L keys, so the depth logits
computed are 128x the useful ones (utilisation 1/128, the paper's "chunk-aware" rung with
C = 128), and with pack_gqa a packed block of 128/G positions still walks the key list of its
128-position block. At T=4096, L=64 that is ~4x the sequence part's key blocks; at T=16384 ~1x.
It also holds T*(1+L) keys twice (k, v) plus their fp32 gradient accumulators.

Every variant is first checked against moda_reference (fp64) on a 512-position prefix of batch 0
(output and the five gradients, `prefix_error`), then timed fwd+bwd
with triton.testing.do_bench (median, p20, p80; L2 flushed, gradients reset each repetition). A
variant that fails prints one line (its error) and the table goes on.

With flash-attn-4 importable (wheels unpacked with .fa4/install_*.sh: `source .fa4/env.sh`):

    PYTHONPATH=$PWD python3 experiments/fa4_mask_route.py                  # T=4096,16384, G=8, Hk=8, L=64, d=64
    PYTHONPATH=$PWD python3 experiments/fa4_mask_route.py --T 4096 --dense-max-T 4096 --rep-ms 200
"""
from __future__ import annotations

import argparse
import traceback

import torch

BLOCK = 128  # FA4's sm90 tile for d <= 64 (fwd 128x128 when a sparse q block is 128; bwd 128x128)


def one_line(exc: BaseException) -> str:
    msg = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {msg[:300]}"


def make_mask_mod(L: int):
    """FA4 mask_mod for the key layout [T sequence keys | T*L depth keys]; T = seqlen_q."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def moda_mask(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        t_ssa = utils.scalar_to_ssa(seqlen_info.seqlen_q, cutlass.Int32)
        l_ssa = utils.scalar_to_ssa(L, cutlass.Int32)
        lo = t_ssa + m_idx * l_ssa  # first depth key of query m_idx
        return (n_idx <= m_idx) | ((n_idx >= lo) & (n_idx < lo + l_ssa))

    return moda_mask


def block_listing(x: torch.Tensor):
    """(cnt [1,1,R], idx [1,1,R,C]) int32 of a bool block matrix [R, C]: each row's True columns,
    ascending, first."""
    cnt = x.sum(1, dtype=torch.int32)
    idx = torch.sort((~x).to(torch.int8), dim=1, stable=True).indices.to(torch.int32)
    return cnt[None, None].contiguous(), idx[None, None].contiguous()


def block_masks(T: int, L: int, device, block: int = BLOCK):
    """(partial, full) bool [query blocks, key blocks] of the MoDA mask over block x block tiles.
    "full": every in-range (query, key) pair is kept (sequence keys entirely below the block's
    first query), so FA4 skips the mask there; listing a block as partial is always safe,
    omitting one that holds a kept pair is not."""
    Tk = T + T * L
    nm, nn = -(-T // block), -(-Tk // block)
    m = torch.arange(nm, device=device)[:, None]
    n = torch.arange(nn, device=device)[None, :]
    r0, r1 = m * block, torch.clamp((m + 1) * block, max=T) - 1  # first/last query of the block
    c0, c1 = n * block, torch.clamp((n + 1) * block, max=Tk) - 1  # first/last key
    seq_any = (c0 < T) & (c0 <= r1)
    full = (c1 < T) & (c1 <= r0)
    p0 = (torch.clamp(c0, min=T) - T) // L  # positions whose depth keys the block holds
    p1 = (c1 - T) // L
    dep_any = (c1 >= T) & (p0 <= r1) & (p1 >= r0)
    return (seq_any | dep_any) & ~full, full


def block_sparsity(T: int, L: int, device):
    """(forward, backward) BlockSparseTensorsTorch of `block_masks` (batch and heads broadcast);
    the backward's is the transpose (for each key block, the query blocks that see it)."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    partial, full = block_masks(T, L, device)

    def tensors(part, fu):
        mc, mi = block_listing(part)
        fc, fi = block_listing(fu)
        return BlockSparseTensorsTorch(mask_block_cnt=mc, mask_block_idx=mi, full_block_cnt=fc, full_block_idx=fi,
                                       block_size=(BLOCK, BLOCK))

    return tensors(partial, full), tensors(partial.T.contiguous(), full.T.contiguous())


def mask_route(q, k, v, kd, vd, mask_mod, sparse):
    from flash_attn.cute import flash_attn_func
    B, T, L, Hk, d = kd.shape
    kc = torch.cat([k, kd.reshape(B, T * L, Hk, d)], dim=1)
    vc = torch.cat([v, vd.reshape(B, T * L, Hk, d)], dim=1)
    fwd_bs, bwd_bs = sparse if sparse is not None else (None, None)
    out = flash_attn_func(q, kc, vc, causal=False, mask_mod=mask_mod, block_sparse_tensors=fwd_bs,
                          block_sparse_tensors_bwd=bwd_bs)
    return out[0] if isinstance(out, tuple) else out


def run_point(T, G, Hk, L, d, args, rows):
    from moda_bench.kernels.moda.fa4.merge import fa4_attention, moda_fa4
    from moda_bench.timing import make_inputs

    names = ("q", "k", "v", "k_depth", "v_depth")
    try:
        inputs = make_inputs(1, T, G * Hk, Hk, d, L, dtype=torch.bfloat16, device="cuda", seed=0)
    except Exception as exc:  # noqa: BLE001
        print(f"T={T}: inputs failed: {one_line(exc)}")
        return
    q, k, v, kd, vd = (inputs[n] for n in names)
    kv_gib = 2 * (T + T * L) * Hk * d * 2 / 2**30
    print(f"\nT={T} G={G} Hk={Hk} L={L} d={d}: concatenated k+v {kv_gib:.2f} GiB")

    variants = [("fa4", lambda: fa4_attention(q, k, v), False),
                ("moda-fa4", lambda: moda_fa4(q, k, v, kd, vd), True)]
    mask_mod = None
    try:
        mask_mod = make_mask_mod(L)
    except Exception as exc:  # noqa: BLE001
        print(f"  mask_mod: {one_line(exc)}")
    if mask_mod is not None:
        sparse = None
        try:
            sparse = block_sparsity(T, L, q.device)
        except Exception as exc:  # noqa: BLE001
            print(f"  block sparsity: {one_line(exc)}")
        if sparse is not None:
            variants.append(("mask-sparse", lambda: mask_route(q, k, v, kd, vd, mask_mod, sparse), True))
        if T <= args.dense_max_T:
            variants.append(("mask-dense", lambda: mask_route(q, k, v, kd, vd, mask_mod, None), True))
        else:
            rows.append(dict(T=T, variant="mask-dense", status="skipped", note=f"T > --dense-max-T={args.dense_max_T}",
                             ms=None))

    for name, fwd, has_depth in variants:
        row = run_variant(name, fwd, has_depth, inputs, T, args)
        rows.append(row)
        print(f"  {name:12s} {row['status']:8s} {row['note']}", flush=True)


def prefix_error(forward, inputs: dict, n: int) -> float:
    """Max ||err|| / ||ref|| of out[0, :n] and of the five gradients' [0, :n] slices vs the fp64
    moda_reference of the sliced problem (exact: positions < n read only keys < n and their own
    depth entries; do is zero elsewhere). Leaves .grad cleared."""
    from moda_bench.kernels.moda import moda_reference
    names = ("q", "k", "v", "k_depth", "v_depth")
    sl = [inputs[k][:1, :n].detach().double().requires_grad_(True) for k in names]
    out = forward()
    do = torch.zeros_like(inputs["do"])
    do[:1, :n] = inputs["do"][:1, :n]
    out.backward(do)
    ref = moda_reference(*sl, out_dtype=torch.float64)
    ref.backward(inputs["do"][:1, :n].double())

    def rel(a, b):
        a = a.detach().double()
        return float((a - b).norm() / b.norm().clamp_min(1e-30)) if torch.isfinite(a).all() else float("inf")

    errs = [rel(out[:1, :n], ref.detach())] + [rel(inputs[k].grad[:1, :n], x.grad) for k, x in zip(names, sl)]
    for k in names:
        inputs[k].grad = None
    return max(errs)


def run_variant(name, fwd, has_depth, inputs, T, args) -> dict:
    """Prefix accuracy check, then fwd+bwd timing: a row dict (T, variant, status, note, ms)."""
    from moda_bench.timing import grad_inputs, make_pass_fn
    from triton.testing import do_bench
    row = dict(T=T, variant=name, status="error", note="", ms=None)
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        err = prefix_error(fwd, inputs, min(512, T)) if has_depth else float("nan")
        if has_depth and not err < args.tol:
            return dict(row, status="wrong", note=f"max_rel_err={err:.3g} > {args.tol:g} vs moda_reference")
        med, p20, p80 = do_bench(make_pass_fn(fwd, inputs, "fwdbwd"), warmup=args.warmup_ms, rep=args.rep_ms,
                                 grad_to_none=grad_inputs(inputs), quantiles=[0.5, 0.2, 0.8])
        peak = torch.cuda.max_memory_allocated() / 2**30
        return dict(row, status="ok", ms=med,
                    note=f"{med:.3f} ({p20:.3f}-{p80:.3f}) ms, err {err:.2e}, peak {peak:.1f} GiB")
    except Exception as exc:  # noqa: BLE001
        if args.verbose:
            traceback.print_exc()
        return dict(row, note=one_line(exc))
    finally:
        for x in grad_inputs(inputs):
            x.grad = None
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="4096,16384")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--dense-max-T", type=int, default=4096, help="largest T for the mask-dense variant")
    ap.add_argument("--tol", type=float, default=1e-2, help="max relative error vs moda_reference (bf16)")
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=100)
    ap.add_argument("--verbose", action="store_true", help="full tracebacks")
    args = ap.parse_args()

    from moda_bench.kernels.moda.fa4.merge import fa4_unavailable, fa4_version
    reason = fa4_unavailable()
    if reason is not None:
        print(f"cannot run: {reason}")
        return 1
    print(f"{torch.cuda.get_device_name()} (sm{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"flash-attn-4 {fa4_version()}, torch {torch.__version__}")
    if args.L < 1:
        print("the mask route needs L >= 1")
        return 1
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        try:
            run_point(T, args.G, args.Hk, args.L, args.d, args, rows)
        except Exception as exc:  # noqa: BLE001
            print(f"T={T}: {one_line(exc)}")

    print("\n| T | variant | status | fwd+bwd ms median (p20-p80), error, peak memory | / fa4 | / moda-fa4 |")
    print("|---:|---|---|---|---:|---:|")
    ms = {(r["T"], r["variant"]): r["ms"] for r in rows if r["ms"]}
    for r in rows:
        t = r["ms"]
        rel = [f"{t / ms[(r['T'], b)]:.2f}" if t and ms.get((r["T"], b)) else "-" for b in ("fa4", "moda-fa4")]
        print(f"| {r['T']} | {r['variant']} | {r['status']} | {r['note']} | {rel[0]} | {rel[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
