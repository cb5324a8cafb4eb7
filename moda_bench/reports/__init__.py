"""Reports layer: everything made from saved result CSVs, without a GPU.

- `report`: REPORT.md and its figures (`inputs` reads, `tables` computes, `markdown` writes,
  `figures` draws; `vocab` holds the words they share);
- `figures`: the report's efficiency figures and the per-sweep one (`plot_sweep`); `plotting`:
  the figure helpers they share; `workloads` and `workload_figures`: the decode and
  Depth-Attention tables and figures and the distance-to-floor figure;
- every table and figure is per GPU: the row key holds the GPU, so two GPUs' rows stay apart;
- `gate`: the regression gate's comparison and its table/summary.

The commands (options, messages, exit codes) live in `moda_bench.cli`.
"""
