"""SGLang's log, read: typed events (`events`) from lines (`lines`, over `prefix`, `batchline`,
`messages`, `failures`; the `server_args=` line: `serverargs`), the memory ledger of a start
(`ledger`), how the run ended and the lines that prove it (`outcome`), startup phases (`phase`)
and the Prefill/Decode lines summed up (`serving`). Pure functions over text, no I/O.
"""
