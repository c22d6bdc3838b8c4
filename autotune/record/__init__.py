"""What a trial leaves in the study, read back as one typed view.

A trial's figures are written once (`autotune.trial` builds them, `autotune.study` stores them as
Optuna user attributes) and read by the search, the study loop, the review and the audits. All of
them read through `TrialView`, so the attribute names live in one place (`keys`). The package sits
below the search, because Optuna hands samplers the raw trials and they read them here too.
"""
