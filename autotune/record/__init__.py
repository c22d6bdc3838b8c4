"""What a trial leaves in the study, read back as one typed view.

A trial's figures are written once (`autotune.trial` builds them, `autotune.study` stores them as
Optuna user attributes) and read by the search, the study loop, the review and the audits. All of
them read through `stored` (each attribute of a trial or a study read by its name, once) and the
`TrialView` built on it, so the attribute names live in one place (`keys`) and are read in one
module. The package sits below the search, because Optuna hands samplers the raw trials and they
read them here too.
"""
