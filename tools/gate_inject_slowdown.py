"""Write a tuning cache whose every entry pins a deliberately poor MoDA config (16-row tiles,
no software pipelining): used to show `moda-bench gate` failing on an injected slowdown
(results/h200/gate-demo/, docs/RUNBOOK.md). Only shapes with a cache entry slow down.

    python3 tools/gate_inject_slowdown.py results/h200/gate-baseline/tuning.json /tmp/bad_cache.json
    MODA_BENCH_TUNING_CACHE=/tmp/bad_cache.json moda-bench gate --run --baseline BASELINE.csv
"""
import argparse
import json

BAD = dict(block_m=16, block_n=16, num_stages=1, bwd_q_block_m=16, bwd_q_block_n=16, bwd_q_stages=1,
           bwd_kv_block_m=16, bwd_kv_block_n=16, bwd_kv_stages=1)

parser = argparse.ArgumentParser(description="Pin a deliberately poor MoDA config in every entry of a tuning cache.")
parser.add_argument("src", help="tuning cache to read (e.g. results/h200/gate-baseline/tuning.json)")
parser.add_argument("dst", help="tuning cache to write")
args = parser.parse_args()
src, dst = args.src, args.dst
cache = json.load(open(src))
for entry in cache["entries"].values():
    entry["config"].update(BAD)
json.dump(cache, open(dst, "w"), indent=1, sort_keys=True)
print(f"wrote {dst}: {len(cache['entries'])} entries pinned to {BAD}")
