"""SGLang's memory arithmetic, once: SGLang's pool formula on plain numbers (`pool`), the KV cell
a launch's ledger implies in the rules of its version (`cell`), one launch's pool sizing from its
ledger (`arithmetic`), the pool its reserve would leave room for if it held only what the trials
measured (`ceiling`), the model that predicts the next launch (`model`) and its fit across the
launches seen (`fit`). Every package that prints or decides by a memory figure (the pool, the
reserve, the free memory after startup, the stress peak, another fraction's prediction) calls
these functions, so the search, the review, `init` and the progress line agree.
"""
