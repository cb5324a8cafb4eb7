"""The host-side launch arithmetic (moda_bench.ops.launch) agrees with Triton's own helpers."""
import triton

from moda_bench.ops.launch import cdiv, next_pow2


def test_cdiv_and_next_pow2_match_triton():
    for a in (0, 1, 2, 3, 15, 16, 17, 63, 64, 65, 1000, 16384, 10**7 + 3):
        for b in (1, 2, 3, 16, 64, 128):
            assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)
        if a >= 1:
            assert next_pow2(a) == triton.next_power_of_2(a)
            assert next_pow2(a) >= a and next_pow2(a) & (next_pow2(a) - 1) == 0
    assert next_pow2(0) == 1 and next_pow2(1) == 1
