"""The card's blocks of REPORT.md: the paper's efficiency table beside one run per GPU
(`reports.paper_efficiency`) and the seeds' complexity tables from formulas (`reports.complexity`).
`reports.report.generate_report` appends `card_blocks(...)` after the efficiency tables."""
from __future__ import annotations


def card_blocks(results, paper, moda: str | None) -> list[str]:
    """The blocks, in order; the efficiency one only where some run matches the paper's points.
    Every row counts, superseded ones too: the paper table reads one run whole."""
    import pandas as pd

    from moda_bench.reports.complexity import complexity_markdown
    from moda_bench.reports.paper_efficiency import paper_efficiency_markdown
    rows = pd.concat([results.rows, results.superseded], ignore_index=True) if len(results.superseded) \
        else results.rows
    eff = paper_efficiency_markdown(rows, paper.efficiency, moda)
    return ([eff] if eff else []) + [complexity_markdown()]
