"""The Python tracebacks SGLang prints when a stage fails, per release: frames and their text.

Each `*_FRAMES` tuple is the stack SGLang's process shows for one failure, as (file, line,
function, source) of that release's site-packages (0.5.9 first, then 0.5.23's `_0523`);
`traceback_block` prints frames the way Python does. They are data, like the flag tables, kept
apart from `loglines` (the lines themselves) so that a release's frames read as one table.
"""

from __future__ import annotations

from collections.abc import Sequence

Frames = tuple[tuple[str, int, str, str], ...]


def traceback_block(frames: Sequence[tuple[str, int, str, str]], final: str) -> str:
    """A Python traceback: frames are (file, line, function, source)."""
    lines = ["Traceback (most recent call last):"]
    for file, line, func, src in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        lines.append(f"    {src}")
    lines.append(final)
    return "\n".join(lines)


_SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"

SCHEDULER_INIT_FRAMES = (
    (f"{_SITE}/managers/scheduler.py", 3178, "run_scheduler_process", "scheduler = Scheduler("),
    (f"{_SITE}/managers/scheduler.py", 363, "__init__", "self.init_model_worker()"),
    (f"{_SITE}/managers/tp_worker.py", 247, "__init__", "self.model_runner = ModelRunner("),
    (
        f"{_SITE}/model_executor/model_runner.py",
        370,
        "__init__",
        "self.initialize(min_per_gpu_memory)",
    ),
)
LOAD_FRAMES = (
    (f"{_SITE}/model_executor/model_runner.py", 465, "initialize", "self.load_model()"),
    (
        f"{_SITE}/model_executor/model_runner.py",
        1012,
        "load_model",
        "self.model = self.loader.load_model(",
    ),
)
POOL_FRAMES = (
    (
        f"{_SITE}/model_executor/model_runner.py",
        590,
        "initialize",
        "self.init_memory_pool(min_per_gpu_memory)",
    ),
    (
        f"{_SITE}/model_executor/model_runner_kv_cache_mixin.py",
        415,
        "init_memory_pool",
        "raise RuntimeError(",
    ),
)
GRAPH_FRAMES = (
    (
        f"{_SITE}/model_executor/model_runner.py",
        2150,
        "init_device_graphs",
        "self.graph_runner = CudaGraphRunner(self)",
    ),
    (f"{_SITE}/model_executor/cuda_graph_runner.py", 371, "__init__", "raise Exception("),
)
HICACHE_FRAMES = (
    (
        f"{_SITE}/managers/scheduler.py",
        702,
        "init_cache_with_memory_pool",
        "self.tree_cache = HiRadixCache(",
    ),
    (f"{_SITE}/mem_cache/memory_pool_host.py", 160, "__init__", "raise ValueError("),
)
RUN_FRAMES = (
    (
        f"{_SITE}/managers/scheduler.py",
        3188,
        "run_scheduler_process",
        "scheduler.event_loop_normal()",
    ),
    (f"{_SITE}/managers/scheduler.py", 1004, "event_loop_normal", "result = self.run_batch(batch)"),
    (
        f"{_SITE}/managers/scheduler.py",
        2340,
        "run_batch",
        "batch_result = self.model_worker.forward_batch_generation(",
    ),
    (f"{_SITE}/model_executor/model_runner.py", 2402, "forward", "output = self._forward_raw("),
    (f"{_SITE}/models/deepseek_v2.py", 2890, "forward", "hidden_states = self.model("),
)


# ---------------------------------------------------------------------------------------------
# 0.5.23 tracebacks (paths and lines from that release's source)

_SITE23 = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
_SCHED23 = f"{_SITE23}/managers/scheduler.py"
_KVC23 = f"{_SITE23}/mem_cache/kv_cache_configurator.py"

SCHEDULER_INIT_FRAMES_0523 = (
    (_SCHED23, 6362, "run_scheduler_process", "scheduler = Scheduler(server_args, port_args)"),
    (_SCHED23, 568, "__init__", "self.init_model_worker()"),
)
LOAD_FRAMES_0523 = (
    (_SCHED23, 1130, "init_model_worker", "self.init_tp_model_worker()"),
    (_SCHED23, 1033, "init_tp_model_worker", "self.tp_worker = TpModelWorker(**worker_kwargs)"),
    (f"{_SITE23}/model_executor/model_runner.py", 715, "initialize", "self.load_model()"),
)
POOL_FRAMES_0523 = (
    (_SCHED23, 1137, "init_model_worker", "self.init_memory_pools()"),
    (_SCHED23, 1090, "init_target_memory_pool", "self.tp_worker.alloc_memory_pool("),
    (
        f"{_SITE23}/managers/tp_worker.py",
        409,
        "alloc_memory_pool",
        "self.model_runner.alloc_memory_pool(",
    ),
    (
        f"{_SITE23}/model_executor/model_runner.py",
        982,
        "alloc_memory_pool",
        "result = self.kv_cache_configurator.configure(",
    ),
    (_KVC23, 476, "configure", "config = self._resolve_memory_pool_config(pre_model_load_memory)"),
)
BUDGET_FRAMES_0523 = (
    (
        _KVC23,
        3182,
        "_resolve_memory_pool_config",
        "available_bytes = self._profile_available_bytes(pre_model_load_memory)",
    ),
    (_KVC23, 3050, "_profile_available_bytes", "raise ValueError("),
)
TOKENS_FRAMES_0523 = (
    (
        _KVC23,
        3183,
        "_resolve_memory_pool_config",
        "config = self.config_from_budget(available_bytes)",
    ),
    (_KVC23, 3204, "config_from_budget", "config = configurator.calculate_pool_sizes("),
    (
        f"{_SITE23}/model_executor/pool_configurator.py",
        99,
        "__post_init__",
        "raise RuntimeError(msg)",
    ),
)
GRAPH_FRAMES_0523 = (
    (_SCHED23, 1146, "init_model_worker", "self.init_all_cuda_graphs()"),
    (_SCHED23, 1124, "init_all_cuda_graphs", "self.tp_worker.init_cuda_graphs()"),
    (
        f"{_SITE23}/managers/tp_worker.py",
        435,
        "init_cuda_graphs",
        "self.model_runner.init_cuda_graphs(",
    ),
    (
        f"{_SITE23}/model_executor/model_runner.py",
        1192,
        "init_cuda_graphs",
        "capture = capture_cuda_graphs(",
    ),
)
DECODE_GRAPH_FRAMES_0523 = (
    (
        f"{_SITE23}/model_executor/runner/decode_cuda_graph_runner.py",
        602,
        "__init__",
        "raise Exception(",
    ),
)
HICACHE_FRAMES_0523 = (
    (_SCHED23, 575, "__init__", "result = kv_cache_builder.build_kv_cache("),
    (f"{_SITE23}/mem_cache/pool_host/base.py", 233, "__init__", "self._allocate_host_buffer()"),
    (f"{_SITE23}/mem_cache/pool_host/base.py", 252, "_allocate_host_buffer", "raise ValueError("),
)
RUN_FRAMES_0523 = (
    (_SCHED23, 6368, "run_scheduler_process", "scheduler.run_event_loop()"),
    (_SCHED23, 6215, "run_event_loop", "return _dispatch_event_loop_once(scheduler)"),
    (_SCHED23, 6231, "_dispatch_event_loop_once", "scheduler.event_loop_overlap()"),
    (_SCHED23, 2109, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    (_SCHED23, 4870, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
    (f"{_SITE23}/model_executor/model_runner.py", 1860, "forward", "output = self._forward_raw("),
    (f"{_SITE23}/models/deepseek_v2.py", 3414, "forward", "hidden_states = self.model("),
)
MAIN_INIT_FRAMES_0523 = (
    (
        "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py",
        84,
        "<module>",
        "run_server(server_args)",
    ),
    (
        "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py",
        67,
        "run_server",
        "launch_server(server_args)",
    ),
    (
        f"{_SITE23}/entrypoints/http_server.py",
        3156,
        "launch_server",
        ") = Engine._launch_subprocesses(",
    ),
    (
        f"{_SITE23}/entrypoints/engine.py",
        995,
        "_launch_subprocesses",
        "infos = _wait_for_scheduler_ready(scheduler_pipe_readers, scheduler_procs)",
    ),
    (
        f"{_SITE23}/entrypoints/engine.py",
        2040,
        "_wait_for_scheduler_ready",
        "raise _scheduler_died_error(j, scheduler_procs[j])",
    ),
)

WARMUP_FRAMES = ((f"{_SITE}/entrypoints/http_server.py", 2373, "_execute_server_warmup",
                  "res = requests.get("),)  # fmt: skip
