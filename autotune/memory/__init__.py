"""SGLang's memory arithmetic, once: one launch's pool sizing from its ledger (`arithmetic`) and
the model fitted across launches that predicts the next (`model`). The search, `explain` and the
report all use these functions, so their figures agree.
"""
