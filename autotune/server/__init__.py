"""One server under test, from launch to verified teardown: the only place that starts or stops
processes.

Lifecycle (`lifecycle`, its process started by `spawn`), what must hold before a launch
(`preflight`, `hostcheck`, `flagcheck`), stopping a process tree and proving it gone (`teardown`,
`procs`, `pidfile`), the live checks (`health`, `logtail`, `logwatch`) and GPU memory as the
harness sees it (`gpu`). It reads logs through the pure `autotune.logparse` and knows nothing of
studies or trials.
"""
