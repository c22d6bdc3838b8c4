"""One trial end to end: the plan (argv, env, port, folder), the run (launch → ready → ledger →
workload → teardown) and its record. `run` decides once what a trial's ending means for the
study; `record` holds the values it hands over.
"""
