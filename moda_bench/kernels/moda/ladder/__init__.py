"""The paper's kernel ablation ladder: one module per rung and the rung table (`table.RUNGS`)."""
