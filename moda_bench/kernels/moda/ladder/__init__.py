"""The cumulative kernel ablation ladder (docs/ABLATION.md): the naive loop (`naive`), the ladder's Triton
kernel with one constexpr switch more a rung (`kernel`), the shipped kernel's configs (`shipped`) and the
rung table (`table.RUNGS`)."""
