"""The morning review: the winner, `explain`, `export`, `confirm`, the status table, the ledger
view, plot data and its renderers (HTML with plotly, PNG with matplotlib) and the report page.

Every surface starts from `source.Review`, built from the stored trials (`autotune.record`), so
each figure is computed once. Only `confirm` launches a server, through `autotune.trial`.
"""
