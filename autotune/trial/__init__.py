"""One trial end to end: the plan (`plan`: argv, env, port, folder), the seam to a server
(`seam`) and its live implementation (`live`, with the GPU readings of `gpuwatch` and `growth`),
the run (`run`: launch → ready → ledger → workload → teardown), what its ending means (`judge`),
and its record (`trialfile`: trial.json; `record`: the values the study is told).
"""
