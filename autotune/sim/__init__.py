"""A CPU-only stand-in for an SGLang server, launched like SGLang: `python -m autotune.sim ...`.

It imports nothing from the rest of autotune and speaks one of several SGLang releases
(`--sim-version`, else the profile's `sglang_version`). The pure side: `versions` (the releases
and their rules, as data), `flagspec` and `flagtables/*.json` (each release's parser as data,
written by `flagdump` from SGLang's own), `flags` (the parser built from them), `profiles`
(hardware/model profiles), `sizing` (SGLang's per-quantity startup formulas), `planbase` (the
sizes a launch settles before its first stage), `memplan` (the startup memory plan in the
release's order), `startupplan` (the plan it returns, as data), `runtime` (forward peaks, the
OOM rule, step times), all five importable without HTTP, `serverargs` (the ServerArgs the
server reports), `prefixcache`, `tokens`, `loglines` and `tracebacks` (each release's line
formats and crash stacks). The process side: `server` and `startup` (lifecycle), `deaths` (how
the process tree ends), `scheduler` (continuous batching in real time), `httpapi`, `openaidocs`
and `metrics` (SGLang's HTTP API), `logwriter` (the log streams), `gpustate` (simulated GPU
memory readable from outside), `faults`.
"""
