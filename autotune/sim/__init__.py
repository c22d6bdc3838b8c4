"""A CPU-only stand-in for an SGLang server, launched like SGLang: `python -m autotune.sim ...`.

It imports nothing from the rest of autotune. `profiles` loads hardware/model profiles, `model` is
the pure memory/timing model (importable without HTTP), `flags` parses SGLang's flags, and the
process side (`server`, `httpapi`, `scheduler`, `logwriter`, `gpustate`, `faults`) runs it.
"""
