"""Reports layer: everything made from saved result CSVs, without a GPU.

- `report`: REPORT.md and its figures (`inputs` reads, `tables` computes, `markdown` writes,
  `figures` draws; `vocab` holds the words they share);
- `figures`: every figure, the report's and the per-sweep one (`plot_sweep`);
- `gate`: the regression gate's comparison and its table/summary.

The commands (options, messages, exit codes) live in `moda_bench.cli`.
"""
