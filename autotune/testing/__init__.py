"""Support for tests and benchmarks, shipped so that scripts and other checkouts can use it: a
fast SGLang-like HTTP server (`fakeserver`) and, with `--log`, its launch's log and life
(`fakelifecycle`), trial records from the simulator's pure model without a launch (`oracle`),
and the audit of a study against its results folder (`audit`).
The product never imports this package (an import-linter contract).
"""
