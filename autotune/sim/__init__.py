"""A CPU-only stand-in for an SGLang server, launched like SGLang: `python -m autotune.sim ...`.

It imports nothing from the rest of autotune. The pure side: `flags` (SGLang's flags as data),
`profiles` (hardware/model profiles), `model` (memory arithmetic, OOM rule, step times;
importable without HTTP), `prefixcache`, `tokens`, `logwriter` (SGLang's line formats). The
process side: `server` and `startup` (lifecycle), `scheduler` (continuous batching in real
time), `httpapi` and `metrics` (SGLang's HTTP API), `gpustate` (simulated GPU memory readable
from outside), `faults`.
"""
