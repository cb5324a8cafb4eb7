"""The seeds' complexity tables, computed from formulas: `moda-bench report`
prints them; nothing here is measured.

* Seed 000's Table "Asymptotic complexity of depth-stream mechanisms": parameters, decoding and
  prefilling cache, decoding and prefilling FLOPs of Depth Dense, Depth Attention and MoDA, as the
  paper's symbolic (dominant-term) column beside exact counts for four model configurations:
  seed 000's 700M and 1.5B (D = 1024, G = 2, T = 4096; 36 layers at 700M, the 1.5B's depth is not
  printed, so its depth-dependent cells are left empty) and seed 002's 1.5B and 3B (Qwen3-style,
  48 layers, T = 2048). The counts follow the paper's read / operate / write description, counting
  only what the depth stream adds to a vanilla decoder:
    - Depth Dense: layer l projects its l preceding (T x D) states back to D, an (l D) x D matrix.
    - Depth Attention: a depth-query projection (D x D) and depth key / value projections
      (2 D x D/G) in each of the L - 1 layers whose output a later layer reads; token t's query
      reads the l depth entries at layer l (width D/G per KV group, H_q heads of d: 4 D l FLOPs per
      token, as `floor.moda_work`'s depth part).
    - MoDA: the same reads with the sequence query reused, so only the key / value projections
      (2 D x D/G in L - 1 layers: the FFN's light-weight KV projection of seed 000's default
      variant; seed 000's 700M gains 36.7M parameters from it, 705.7M - 669.0M, = 35 x 2 x 1024 x 512).
  Caches are elements (x2 bytes in 16-bit): every layer's depth K and V (D/G each) per token;
  Depth Dense keeps every layer's D-wide state.
* Seed 002's Table 2: extra FLOPs, extra activation I/O per token over the whole model and the
  extra persistent memory of a 128K-token prefill of Depth-Attention, DenseFormer, Attention
  Residuals and mHC, with the seed's own formulas (its Appendix B: 2 FLOPs per multiply-add,
  b = 2 bytes). Two inputs are the seed's printed sums, not derived here, because the seed does not
  spell out their schedules: sum over layers of Depth-Attention's sources (117 at L = 48, s = 24)
  and of Attention Residuals' blocks (520); mHC's FLOPs and I/O come from its stream-mixing module's
  operation count, which the seed prints (4.72e7, 8.63 MiB) without a formula. Those cells say so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

BYTES = 2   # 16-bit activations and caches (seed 002, Appendix B.1)


@dataclass(frozen=True)
class Model:
    """A model configuration of the seeds: width D, GQA group G, layers L (None: not printed),
    query heads Hq (head size d = D / Hq), sequence length T."""

    name: str
    source: str
    D: int
    G: int
    L: Optional[int]
    Hq: int
    T: int

    @property
    def d(self) -> int:
        return self.D // self.Hq

    @property
    def Hk(self) -> int:
        return self.Hq // self.G

    @property
    def dkv(self) -> int:
        """Width of one layer's key (or value) state: Hk d = D / G."""
        return self.Hk * self.d


# seed 000: "The width D, GQA group size G, sequence length T are set to 1024, 2, and 4096" for
# both sizes; 36 layers at 700M (its Table of MoDA variants); Hq = 16 (d = 64) is the head size
# its kernels use. Seed 002 Table 8: hidden 1536 / 2048, 24 / 32 heads, 6 / 8 KV heads, 48 layers.
MODELS = (
    Model("700M", "seed 000", D=1024, G=2, L=36, Hq=16, T=4096),
    Model("1.5B", "seed 000", D=1024, G=2, L=None, Hq=16, T=4096),
    Model("1.5B", "seed 002", D=1536, G=4, L=48, Hq=24, T=2048),
    Model("3B", "seed 002", D=2048, G=4, L=48, Hq=32, T=2048),
)
METHODS = ("Depth Dense", "Depth Attention", "MoDA")
QUANTITIES = ("Parameters", "Decoding cache", "Prefilling cache", "Decoding FLOPs", "Prefilling FLOPs")
# the paper's dominant terms (seed 000's table)
SYMBOLIC = {
    ("Parameters", "Depth Dense"): "O(L^2 D^2)", ("Parameters", "Depth Attention"): "O(L D^2)",
    ("Parameters", "MoDA"): "O(L D^2 / G)",
    ("Decoding cache", "Depth Dense"): "O(L D)", ("Decoding cache", "Depth Attention"): "O(L D / G)",
    ("Decoding cache", "MoDA"): "O(L D / G)",
    ("Prefilling cache", "Depth Dense"): "O(T L D)", ("Prefilling cache", "Depth Attention"): "O(T L D / G)",
    ("Prefilling cache", "MoDA"): "O(T L D / G)",
    ("Decoding FLOPs", "Depth Dense"): "O(L^2 D^2)", ("Decoding FLOPs", "Depth Attention"): "O(L^2 D)",
    ("Decoding FLOPs", "MoDA"): "O(L^2 D)",
    ("Prefilling FLOPs", "Depth Dense"): "O(T L^2 D^2)", ("Prefilling FLOPs", "Depth Attention"): "O(T L^2 D)",
    ("Prefilling FLOPs", "MoDA"): "O(T L^2 D)",
}


def depth_read_flops(T: int, Hq: int, d: int, n_entries: int) -> float:
    """FLOPs of T tokens' queries (Hq heads of d) reading n depth entries each: scores and the
    weighted sum, 2 FLOPs per multiply-add (the depth part of `floor.moda_work`'s forward)."""
    return 4.0 * T * Hq * d * n_entries


def depth_cache_elements(T: int, Hk: int, d: int, n_entries: int) -> int:
    """Elements of n depth entries' keys and values for T tokens (what a MoDA layer reads)."""
    return 2 * T * n_entries * Hk * d


def seed000_value(quantity: str, method: str, m: Model) -> float:
    """Exact count of one cell of seed 000's complexity table for model m (NaN without L)."""
    if m.L is None:
        return math.nan
    L, D, tri = m.L, m.D, m.L * (m.L + 1) // 2          # tri: sum over layers of the l entries read
    if method == "Depth Dense":
        params = tri * D * D
        decode_flops = 2.0 * params                    # every layer's projection, once per token
        cache = L * D
    else:
        writers = L - 1                                  # the last layer's depth K/V (and query) has no reader
        params = 2 * writers * D * m.dkv + (writers * D * D if method == "Depth Attention" else 0)
        decode_flops = 2.0 * params + sum(depth_read_flops(1, m.Hq, m.d, l) for l in range(1, L + 1))
        cache = 2 * L * m.dkv
    return {"Parameters": float(params), "Decoding cache": float(cache), "Prefilling cache": float(m.T * cache),
            "Decoding FLOPs": decode_flops, "Prefilling FLOPs": m.T * decode_flops}[quantity]


# ---- seed 002, Table 2 ------------------------------------------------------------------------

PREFILL_T = 131072
TABLE2_METHODS = ("Depth-Attention", "DenseFormer", "Attention Residuals", "mHC")
TABLE2_SYMBOLIC = {"Depth-Attention": ("O((l/s + 1) d_kv)", "O((l/s + 1) d_kv)"),
                   "DenseFormer": ("O(l d_model)", "O(l d_model)"),
                   "Attention Residuals": ("O(R_l d_model)", "O(R_l d_model)"),
                   "mHC": ("O(N^3 d_model)", "O(N d_model)")}
DATTN_SOURCES = 117        # seed 002 B.2: sum over layers of the depth sources, L = 48, s = 24 (printed)
ATTNRES_BLOCKS = 520       # seed 002 B.4: sum over layers of the residual blocks read (printed)
ATTNRES_STORED = 8         # stored block representations (2L / block size 12)
MHC_STREAMS = 4
MHC_FLOPS, MHC_IO_BYTES = 4.72e7, 8.63 * 2 ** 20   # seed 002 B.5, printed without a formula


def table2_row(method: str, m: Model) -> dict:
    """Extra FLOPs and activation bytes per token over the whole model, extra 128K-prefill memory
    (bytes) of one seed 002 method at model m, and which inputs are printed in the seed."""
    L, dm = m.L, m.D
    if method == "Depth-Attention":
        return dict(flops=4.0 * m.dkv * DATTN_SOURCES, io=BYTES * m.dkv * (2 * DATTN_SOURCES + L), memory=0.0,
                    note=f"sum of sources {DATTN_SOURCES} as printed (L=48, s=24)")
    if method == "DenseFormer":
        s = sum(l + 1 for l in range(1, L + 1))
        return dict(flops=2.0 * dm * s, io=BYTES * dm * (s + L), memory=float(PREFILL_T * L * dm * BYTES), note="")
    if method == "Attention Residuals":
        return dict(flops=4.0 * dm * ATTNRES_BLOCKS, io=BYTES * dm * (2 * ATTNRES_BLOCKS + 2 * L),
                    memory=float(PREFILL_T * ATTNRES_STORED * dm * BYTES),
                    note=f"sum of blocks {ATTNRES_BLOCKS} as printed")
    if method == "mHC":
        printed = m.D == 2048                         # the seed prints its 3B numbers only
        return dict(flops=MHC_FLOPS if printed else math.nan, io=MHC_IO_BYTES if printed else math.nan,
                    memory=float(PREFILL_T * (MHC_STREAMS - 1) * dm * BYTES),
                    note="FLOPs and I/O as printed (3B only)")
    raise ValueError(f"unknown method {method!r}; known: {', '.join(TABLE2_METHODS)}")


def depth_attention_layer_io(T: int, Hk: int, d: int, n_sources: int) -> float:
    """Seed 002's extra activation bytes of one Depth-Attention layer for T tokens: read the M
    source keys and values, write the mixed value (b d_kv (2M + 1) per token)."""
    return float(BYTES * T * Hk * d * (2 * n_sources + 1))


# ---- formatting -------------------------------------------------------------------------------

def si(x: float, unit: str = "") -> str:
    """3 significant digits with a K / M / G / T suffix ('-' for NaN)."""
    if x != x:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def binary(nbytes: float) -> str:
    """Bytes as KiB / MiB / GiB with 3 significant digits ('-' for NaN)."""
    if nbytes != nbytes:
        return "-"
    for div, suffix in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if nbytes >= div:
            return f"{nbytes / div:.3g} {suffix}"
    return f"{nbytes:.3g} B"


def complexity_markdown() -> str:
    """Both tables as a report block."""
    from moda_bench.reports.markdown import md_table
    heads = ["quantity", "method", "symbolic (seed 000)"] + [
        f"{m.name} ({m.source}{'' if m.L else ', L not printed'})" for m in MODELS]
    body = [[q, meth, SYMBOLIC[(q, meth)]] + [si(seed000_value(q, meth, m)) for m in MODELS]
            for q in QUANTITIES for meth in METHODS]
    configs = "; ".join(f"{m.name} ({m.source}): D={m.D}, G={m.G}, L={m.L or 'not printed'}, Hq={m.Hq}, T={m.T}"
                        for m in MODELS)
    t2_heads = ["method", "layer-l FLOPs", "layer-l I/O"] + [
        f"{m.name} {what}" for m in MODELS[2:] for what in ("FLOPs / token", "I/O / token", "128K prefill")] + ["note"]
    t2_body = []
    for meth in TABLE2_METHODS:
        cells = [meth, *TABLE2_SYMBOLIC[meth]]
        for m in MODELS[2:]:
            r = table2_row(meth, m)
            cells += [si(r["flops"]), binary(r["io"]), binary(r["memory"]) if r["memory"] else "0 GiB"]
        t2_body.append(cells + [table2_row(meth, MODELS[3])["note"] or "-"])
    return ("## Complexity (from formulas)\n\nSeed 000's complexity table: the paper's dominant terms beside exact "
            "counts of what the depth stream adds to a vanilla decoder (parameters; cache in elements, x2 bytes "
            "in 16-bit; FLOPs at 2 per multiply-add; decoding = one token, prefilling = T tokens). Depth "
            "Attention and MoDA read the same depth entries (l at layer l); MoDA reuses the sequence query, so "
            f"only the depth key / value projections remain. Configurations: {configs}.\n\n"
            + md_table(heads, body)
            + "\n\nSeed 002's Table 2: extra FLOPs and activation I/O per token over the whole model and the extra "
            "persistent memory of a 128K-token prefill, with the seed's Appendix B formulas (L=48, s=24, "
            "16-bit). The seed's printed 3B numbers: Depth-Attention 2.40e5 FLOPs, 282 KiB, 0 GiB; DenseFormer "
            "5.01e6, 4.97 MiB, 24.0 GiB; Attention Residuals 4.26e6, 4.44 MiB, 4.0 GiB; mHC 4.72e7, 8.63 MiB, "
            "1.5 GiB. The 1.5B columns apply the same formulas and printed sums to the 1.5B configuration.\n\n"
            + md_table(t2_heads, t2_body))
