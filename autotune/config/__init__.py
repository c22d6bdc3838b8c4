"""The study file: its schema as frozen typed dataclasses, strict TOML loading, and the search
space ⇄ SGLang flags.

`schema` holds the frozen values a study is, `studyfile` loads and validates `configs/NAME.toml`
into them (the workload table in `workload`), `space` turns a trial's parameters into launch
flags and back. Everything above reads the study through these values; nothing here touches a
process, a file other than the study file, or Optuna's storage.
"""
