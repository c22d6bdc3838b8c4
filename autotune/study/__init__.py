"""The Optuna study a tuning run lives in: storage and resume (`storage`), samplers by name
(`samplers`), objectives and constraints (`objectives`), the ask/run/tell loop (`loop`), one
run of it with the operator's progress line (`runner`, `progress`), and several workers sharing
one study (`workers`). Optuna's private API is reached only through `autotune.record.internals`.
"""
