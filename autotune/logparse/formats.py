"""Where each line the ledger and outcome rules read comes from in SGLang 0.5.23's source.

One row per rule: the rule's name, the file under `sglang/srt/` and the string literal or
f-string SGLang formats the line from, written as Python's AST gives it back (adjacent literals
joined, f-string fields as `{expr}`, `{expr!r}` for `{expr=}`, `{expr:.2f}` with their format
specs, `1e9` as `1000000000.0`). A line made of several pieces (`msg += …`) lists them in order.
`style` is "f" for an f-string, "%" for a logger format with %-arguments, "plain" for a literal.

The oracle test (`tests/logparse/test_oracle_formats.py`) finds every text in the installed
SGLang, renders lines from them with sample values and parses them; a release that rewords a line
fails it, naming the rule. The parser itself never reads this table: its rules match the class
of line (`logparse.lines`), which also covers the releases before 0.5.23 that the fixtures hold.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One piece of a line as SGLang 0.5.23 formats it: the file under `sglang/srt/`, the literal or
    f-string as the AST gives it back, and its `style` (`f`, `%` or `plain`)."""

    path: str
    text: str
    style: str = "f"


@dataclass(frozen=True)
class Rule:
    """`reads`: the event kind (or "batch") the rule turns the line into."""

    name: str
    reads: str
    sources: tuple[Source, ...]


def _r(name: str, reads: str, *sources: Source) -> Rule:
    return Rule(name, reads, sources)


_ENGINE = "entrypoints/engine.py"
_HTTP = "entrypoints/http_server.py"
_BOOT = "distributed/bootstrap.py"
_RUNNER = "model_executor/model_runner.py"
_POOL = "mem_cache/memory_pool.py"
_KVC = "mem_cache/kv_cache_configurator.py"
_POOLCFG = "model_executor/pool_configurator.py"
_GRAPHS = "model_executor/model_runner_components/cuda_graph_setup.py"
_EAGLE = "speculative/eagle_worker_v2.py"
_MLEAGLE = "speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py"
_POST = "model_executor/model_runner_components/kv_pool_runtime.py"
_SCHED = "managers/scheduler.py"
_TOK = "managers/tokenizer_manager.py"
_HOST = "mem_cache/pool_host/base.py"
_AUTO = "mem_cache/hicache_auto_size.py"
_ALLOC = "mem_cache/allocation.py"
_METRICS = "managers/scheduler_components/metrics_reporter.py"
_POOLSTATS = "managers/scheduler_components/pool_stats_observer.py"
_WATCHDOG = "utils/watchdog.py"
_TP = "managers/tp_worker.py"
_GEMM = "layers/deep_gemm_wrapper/compile_utils.py"
_BATCH = "managers/schedule_batch.py"
_NET = "utils/network.py"

# The MHA pool's allocation line: a rule of its own, and the last piece of a labelled pool's line.
_MHA_POOL = Source(
    _POOL,
    "{cache_name} {'VA upper bound' if self.post_capture_active else 'is allocated'}. "
    "dtype: {self.dtype}, #tokens: {num_tokens}, K size: {k_size_GB:.2f} GB, "
    "V size: {v_size_GB:.2f} GB",
)

# A Prefill line after its pool's usage parts (`token_usage_msg`, `pool_stats_observer.py`).
_PREFILL_HEAD = Source(
    _METRICS,
    "Prefill batch{iter_msg}, #new-seq: {prefill_stats.num_new_seqs}, "
    "#new-token: {prefill_stats.log_input_tokens}, "
    "#cached-token: {prefill_stats.log_hit_tokens}, {token_usage_msg}"
    "#running-req: {prefill_stats.num_running_reqs.total}, "
    "#queue-req: {len(self.scheduler.waiting_queue)}, "
    "#pending-token: {prefill_stats.num_pending_tokens}, ",
)
_PREFILL_GRAPH = Source(_METRICS, "{self._graph_backend_label}: {can_run_cuda_graph}, ")
_PREFILL_TAIL = Source(_METRICS, "input throughput (token/s): {self.last_input_throughput:.2f}")

RULES: tuple[Rule, ...] = (
    # -- startup, in order -------------------------------------------------------------------
    _r(
        "server_args",
        "server_args",
        Source(_ENGINE, "server_args={_server_args_for_logging(server_args)}"),
    ),
    _r("dist_init_begin", "dist_init_begin", Source(_BOOT, "Init parallel begin.", "plain")),
    _r(
        "dist_init_end",
        "dist_init_end",
        Source(_BOOT, "Init parallel ends. elapsed={time.perf_counter() - tic:.2f} s"),
    ),
    _r(
        "memory_baseline",
        "memory_baseline",
        Source(
            _BOOT,
            "Memory baseline taken. mem usage={before_avail_memory - local_gpu_memory:.2f} GB",
        ),
    ),
    _r(
        "unbalanced_memory",
        "unbalanced_memory",
        Source(
            _BOOT,
            "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. ",
            "plain",
        ),
    ),
    _r(
        "weight_load_begin",
        "weight_load_begin",
        Source(
            _RUNNER,
            "Load weight begin. "
            "avail mem={get_available_gpu_memory(self.device, self.gpu_id):.2f} GB",
        ),
    ),
    _r(
        "weight_load_end",
        "weight_load_end",
        Source(
            _RUNNER,
            "Load weight end. elapsed={self.weight_load_time:.2f} s, "
            "type={type(self.model).__name__}, {quant_str + ', ' if quant_str else ''}"
            "avail mem={after_avail_memory:.2f} GB, mem usage={self.weight_load_mem_usage:.2f} GB.",
        ),
        Source("configs/model_config.py", "quant={quant_method}"),
    ),
    _r(
        "weight_commit",
        "weight_commit",
        Source(
            "model_executor/model_runner_components/startup_weight_load.py",
            "Load weight end. Committed real weights after CUDA graph capture in %.2f s "
            "(capture overlap window %.2f s, startup overlap total %.2f s)",
            "%",
        ),
    ),
    _r(
        "swa_pool",
        "swa_pool",
        Source(
            _POOLCFG,
            "Use sliding window memory pool. full_layer_tokens={full_tokens}, "
            "swa_layer_tokens={swa_tokens}",
        ),
    ),
    _r(
        "swa_kv_pool",
        "swa_pool",
        Source(
            "mem_cache/swa_memory_pool.py",
            "SWAKVPool {'VA upper bound' if self.post_capture_active else 'mem usage'}: "
            "{self.mem_usage:.2f} GB, swa size: {self.size_swa}, full size: {self.size}",
        ),
    ),
    _r(
        "kv_cap_ignored",
        "kv_cap_ignored",
        Source(
            _KVC,
            "max_total_tokens={user_limit} is larger than the profiled value {token_capacity}. "
            "Use the profiled value instead.",
        ),
    ),
    _r(
        "mrr_reduced",
        "mrr_reduced",
        Source(
            _KVC,
            "max_running_requests was reduced from the requested %d to %d (per dp worker) due to "
            "the available KV cache capacity.",
            "%",
        ),
    ),
    _r(
        "mrr_spec_reset",
        "mrr_spec_reset",
        Source(
            "arg_groups/speculative_hook.py",
            "Max running requests is reset to 48 for speculative decoding. You can override this "
            "by explicitly setting --max-running-requests.",
            "plain",
        ),
    ),
    _r(
        "kv_allocated_mla",
        "kv_allocated",
        Source(
            _POOL,
            "{cache_name} {'VA upper bound' if self.post_capture_active else 'is allocated'}. "
            "dtype: {self.dtype}, #tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB",
        ),
    ),
    _r("kv_allocated_mha", "kv_allocated", _MHA_POOL),
    _r(
        "kv_allocated_labelled",
        "kv_allocated",
        Source(_POOL, "{self.allocation_label} KV Cache"),
        Source("mem_cache/swa_memory_pool.py", "SWA", "plain"),
        _MHA_POOL,
    ),
    _r(
        "mamba_allocated",
        "mamba_allocated",
        Source(
            _POOL,
            "Mamba Cache is allocated. max_mamba_cache_size: {size}, "
            "conv_state size: {get_tensor_size_bytes(conv_state) / GB:.2f}GB, "
            "ssm_state size: {get_tensor_size_bytes(temporal_state) / GB:.2f}GB ",
        ),
    ),
    _r(
        "mamba_allocated_spec",
        "mamba_allocated",
        Source(
            _POOL,
            "Mamba Cache is allocated. max_mamba_cache_size: {size}, "
            "conv_state size: {get_tensor_size_bytes(conv_state) / GB:.2f}GB, "
            "ssm_state size: {get_tensor_size_bytes(temporal_state) / GB:.2f}GB "
            "intermediate_ssm_state_cache size: {intermediate_ssm_gb:.2f}GB "
            "intermediate_conv_window_cache size: "
            "{get_tensor_size_bytes(self._intermediate_conv_window_phys) / GB:.2f}GB ",
        ),
    ),
    _r(
        "memory_pool_end",
        "memory_pool_end",
        Source(
            _KVC,
            "Memory pool end. "
            "avail mem={get_available_gpu_memory(self.device, self.gpu_id):.2f} GB",
        ),
    ),
    _r(
        "capture_prefill_begin",
        "graph_capture_begin",
        Source(_GRAPHS, "{role} prefill"),
        Source(
            _GRAPHS,
            "Capture {capture_name} CUDA graph begin. backend={prefill_backend}, "
            "num_tokens={capture_num_tokens}, avail mem={before_mem:.2f} GB",
        ),
    ),
    _r(
        "capture_prefill_end",
        "graph_capture_end",
        Source(
            _GRAPHS,
            "Capture {capture_name} CUDA graph end. elapsed={capture_time:.2f} s, "
            "mem usage={mem_usage:.2f} GB, avail mem={after_mem:.2f} GB.",
        ),
    ),
    _r(
        "capture_decode_begin",
        "graph_capture_begin",
        Source(_GRAPHS, "{role} verify"),
        Source(_GRAPHS, "{role} decode"),
        Source(_GRAPHS, "CUDA graph", "plain"),
        Source(
            _GRAPHS,
            "Capture {capture_name} {graph_backend[model_runner.device]} begin. "
            "backend={decode_backend}, num_tokens_per_req={num_tokens_per_req}, "
            "avail mem={before_mem:.2f} GB",
        ),
    ),
    _r(
        "capture_decode_end",
        "graph_capture_end",
        Source(
            _GRAPHS,
            "Capture {capture_name} {graph_backend[model_runner.device]} end. "
            "bs={runner.capture_bs}, elapsed={capture_time:.2f} s, "
            "mem usage={memory_usage_gb:.2f} GB, avail mem={after_mem:.2f} GB.",
        ),
    ),
    _r(
        "capture_draft_decode_begin",
        "graph_capture_begin",
        Source(
            _EAGLE,
            "Capture draft decode CUDA graph begin. backend={decode_backend}, "
            "num_tokens_per_req={self.topk}, bs={capture_bs}, avail mem={before_mem:.2f} GB",
        ),
    ),
    _r(
        "capture_draft_decode_end",
        "graph_capture_end",
        Source(
            _EAGLE,
            "Capture draft decode CUDA graph end. elapsed={capture_time:.2f} s, "
            "mem usage={before_mem - after_mem:.2f} GB, avail mem={after_mem:.2f} GB.",
        ),
    ),
    _r(
        "capture_draft_extend_begin",
        "graph_capture_begin",
        Source(
            _EAGLE,
            "Capture draft extend CUDA graph begin. backend={decode_backend}, "
            "num_tokens_per_req={self.speculative_num_draft_tokens}, bs={capture_bs}, "
            "avail mem={before_mem:.2f} GB",
        ),
    ),
    _r(
        "capture_draft_extend_end",
        "graph_capture_end",
        Source(
            _EAGLE,
            "Capture draft extend CUDA graph end. elapsed={capture_time:.2f} s, "
            "mem usage={before_mem - after_mem:.2f} GB, avail mem={after_mem:.2f} GB.",
        ),
    ),
    _r(
        "capture_multi_layer_extend_end",
        "graph_capture_end",
        Source(
            _MLEAGLE,
            "Capture draft extend CUDA graph end. step={step}, "
            "elapsed={time.perf_counter() - tic:.2f} s, mem usage={before_mem - after_mem:.2f} GB, "
            "avail mem={after_mem:.2f} GB.",
        ),
    ),
    _r(
        "capturing_batches",
        "graph_capturing",
        Source(
            "model_executor/runner/decode_cuda_graph_runner.py",
            "Capturing batches (bs={bs!r} avail_mem={avail_mem:.2f} GB)",
        ),
    ),
    _r(
        "capturing_prefill",
        "graph_capturing",
        Source(
            "model_executor/runner/prefill_cuda_graph_runner.py",
            "Capturing prefill shape (num_tokens={num_tokens!r} avail_mem={avail_mem:.2f} GB)",
        ),
    ),
    _r(
        "capture_failed",
        "graph_capture_failed",
        Source(
            "model_executor/runner/decode_cuda_graph_runner.py",
            "Capture cuda graph failed: {e}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}",
        ),
    ),
    _r(
        "capture_prefill_failed",
        "graph_capture_failed",
        Source(
            "model_executor/runner/prefill_cuda_graph_runner.py",
            "Capture prefill CUDA graph failed: {e}\n"
            "{prefill_failure_msg(self.prefill_backend_name)}",
        ),
    ),
    _r(
        "post_capture_kv",
        "post_capture",
        Source(
            _POST,
            "Post-capture KV sizing: KV cache allocated. dtype: %s, #tokens: %d, "
            "KV size: %.2f GB, avail mem=%.2f GB",
            "%",
        ),
    ),
    _r(
        "post_capture_draft_kv",
        "post_capture",
        Source(
            _POST,
            "Post-capture KV sizing: draft KV cache allocated. dtype: %s, #tokens: %d, "
            "KV size: %.2f GB",
            "%",
        ),
    ),
    _r(
        "post_capture_mrr",
        "post_capture",
        Source(_POST, "Post-capture KV sizing: max_running_requests %d -> %d", "%"),
    ),
    _r(
        "post_capture_canary",
        "post_capture",
        Source(_POST, "Post-capture KV sizing: KV-canary per-forward workspace %.2f GB", "%"),
    ),
    _r(
        "post_capture_swa",
        "post_capture",
        Source(_POST, "Post-capture KV sizing: full_layer_tokens=%d, swa_layer_tokens=%d", "%"),
    ),
    _r(
        "post_capture_eager_gap",
        "post_capture",
        Source(
            _POST,
            "Post-capture KV sizing: decode CUDA graph max_bs=%d < max_running_requests=%d; "
            "reserving activation headroom",
            "%",
        ),
    ),
    _r(
        "pool_below_context",
        "pool_below_context",
        Source(
            _TP,
            "KV pool holds %d tokens, fewer than --context-length %d. One full-length request "
            "cannot fit, so long requests will be refused or truncated at serving time. Lower "
            "--context-length, raise --mem-fraction-static, or free memory taken before the pool "
            "is sized.",
            "%",
        ),
    ),
    _r(
        "scheduler_summary",
        "scheduler_summary",
        Source(
            _SCHED,
            "max_total_num_tokens={self.max_total_num_tokens}, "
            "chunked_prefill_size={get_schedule().chunked_prefill_size}, "
            "max_prefill_tokens={self.max_prefill_tokens}, "
            "max_running_requests={self.max_running_requests}, "
            "context_len={self.model_config.context_len}, "
            "{'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'}="
            "{self.startup_available_gpu_memory_gb:.2f} GB",
        ),
    ),
    _r(
        "host_headroom",
        "host_headroom",
        Source(
            "mem_cache/host_memory.py",
            "HiCache memory headroom: host %.1f GiB, cgroup %.1f GiB",
            "%",
        ),
    ),
    _r(
        "hicache_autosize",
        "hicache_autosize",
        Source(
            _AUTO,
            "HiCache auto-sizing: ratio %.3f -> %.3f; %.1f GiB host memory per rank "
            "(fraction %.2f, %d ranks on this host), host pools %.1f GiB.",
            "%",
        ),
    ),
    _r(
        "hicache_smaller",
        "hicache_smaller",
        Source(
            _HOST,
            "HiCache %s host pool (%d tokens) is smaller than the device pool (%d tokens);"
            "L2 cache effectiveness is reduced.Consider increasing --hicache-ratio (or "
            "--hicache-size) for higher L2 cache hit rate.",
            "%",
        ),
    ),
    _r(
        "host_pool",
        "host_cache",
        Source(
            _HOST, "Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory.", "%"
        ),
    ),
    _r(
        "host_pool_packed_mtp",
        "host_cache",
        Source(
            _HOST,
            "Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory, packed MTP "
            "KV layers: target_layers=%d, draft_layers=%d, total_layers=%d.",
            "%",
        ),
    ),
    _r(
        "host_pool_draft_label",
        "host_cache",
        Source("mem_cache/hybrid_cache/hybrid_pool_assembler.py", "draft", "plain"),
        Source(
            _HOST, "Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory.", "%"
        ),
    ),
    _r(
        "startup_timings",
        "startup_timings",
        Source(_ENGINE, "{phase}={duration:.2f}"),
        Source(
            _ENGINE,
            "Engine startup timings (s): load_weight=%.2f, kv_cache_allocation=%.2f, "
            "scheduler_e2e=%.2f, cuda_graph={%s}, tokenizer_e2e=%.2f",
            "%",
        ),
    ),
    _r("ready", "ready", Source(_HTTP, "The server is fired up and ready to roll!", "plain")),
    # -- serving -----------------------------------------------------------------------------
    _r(
        "prefill_batch",
        "batch",
        Source(_POOLSTATS, "token usage: {self.full_token_usage:.2f}"),
        _PREFILL_HEAD,
        _PREFILL_GRAPH,
        _PREFILL_TAIL,
    ),
    _r(
        "prefill_batch_swa",
        "batch",
        Source(_POOLSTATS, "full token usage: {self.full_token_usage:.2f}"),
        Source(_POOLSTATS, "swa token usage: {self.swa_token_usage:.2f}"),
        _PREFILL_HEAD,
        _PREFILL_GRAPH,
        _PREFILL_TAIL,
    ),
    _r(
        "prefill_batch_mamba",
        "batch",
        Source(_POOLSTATS, "full token usage: {self.full_token_usage:.2f}"),
        Source(_POOLSTATS, "mamba usage: {self.mamba_usage:.2f}"),
        _PREFILL_HEAD,
        _PREFILL_GRAPH,
        _PREFILL_TAIL,
    ),
    _r(
        "decode_batch",
        "batch",
        Source(
            _POOLSTATS, "#token: {self.full_num_used}, token usage: {self.full_token_usage:.2f}"
        ),
        Source(
            _METRICS, "Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"
        ),
        Source(
            _METRICS,
            "accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, ",
        ),
        Source(
            _METRICS,
            "{self._graph_backend_label}: {can_run_cuda_graph}, "
            "gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            "#queue-req: {len(self.scheduler.waiting_queue)}",
        ),
    ),
    _r(
        "retract",
        "retract",
        Source(_SCHED, "KV cache pool is full. Retract requests. ", "plain"),
        Source(
            _SCHED,
            "#retracted_reqs: {len(retracted_reqs)}, #new_tokens_gained: {new_token_gained}",
        ),
        Source(_SCHED, ", #new_token_ratio: {old_ratio:.4f} -> {new_token_ratio:.4f}"),
    ),
    _r("retract_test", "retract", Source(_SCHED, "Testing retraction. ", "plain")),
    _r(
        "request_oom_abort",
        "request_oom_abort",
        Source(_BATCH, "retract_decode: aborted last request %s due to OOM", "%"),
    ),
    _r(
        "request_oom_abort_reason",
        "request_oom_abort",
        Source(
            _BATCH,
            "Out of memory even after retracting all other requests in the decode batch. "
            "Aborting the last request.",
            "plain",
        ),
    ),
    # -- handled out-of-memory: logged, then a fallback (serving events) -----------------------
    _r(
        "oom_fallback_graph_dedup",
        "oom_handled",
        Source(
            "model_executor/runner_backend/cuda_graph_dedup_mixin.py",
            "[CudaGraph][dedup] %s init failed (%s); using plain executables.",
            "%",
        ),
    ),
    _r(
        "oom_retry",
        "oom_handled",
        Source(
            "utils/common.py",
            "retry() failed once ({try_index}th try, maximum {max_retry} retries). Will delay "
            "{delay:.2f}s and retry. Error: {e}",
        ),
    ),
    _r(
        "oom_fallback_vmm",
        "oom_handled",
        Source(
            "utils/cuda_vmm_utils.py",
            "CUDA VMM %s backing unavailable on device %d; trying fallback: %s",
            "%",
        ),
    ),
    # -- ports: SGLang waiting for one (events), then giving up (a machine fault) ---------------
    _r(
        "port_wait",
        "port_wait",
        Source(
            _NET,
            "port {port} is in use. Waiting for {i} seconds for {port_name} to be available. "
            "{error_message}",
        ),
    ),
    _r(
        "port_wait_unknown_holder",
        "port_wait",
        Source(_NET, "The port {port} is in use, but we could not find the process that uses it."),
    ),
    _r("port_next", "port_wait", Source(_NET, "Port %d is already in use, trying port %d", "%")),
    _r(
        "port_not_available",
        "port_in_use",
        Source(
            _NET, "{port_name} at {port} is not available in {timeout_s} seconds. {error_message}"
        ),
    ),
    _r(
        "ports_in_use",
        "port_in_use",
        Source(
            "server_args.py",
            "Port is already in use. dist_init_port={dist_init_port!r} port_base={port_base!r} "
            "detokenizer_port={detokenizer_port!r} nccl_port={nccl_port!r} "
            "scheduler_input_port={scheduler_input_port!r}",
        ),
    ),
    _r(
        "bootstrap_port_in_use",
        "port_in_use",
        Source(
            _ENGINE,
            "engine_info_bootstrap_port {bootstrap_port} is already in use. When running multiple "
            "instances on the same node, each instance must use a different "
            "--engine-info-bootstrap-port.",
        ),
    ),
    # -- failures ----------------------------------------------------------------------------
    _r(
        "no_kv_room",
        "no_kv_room",
        Source(
            _KVC,
            "Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static={get_schedule().mem_fraction_static}. Raise "
            "--mem-fraction-static above {suggested_mem_fraction_static:.3f} (minimum viable = "
            "1 - available/pre = {minimum_mem_fraction_static:.4f}). If using speculative "
            "decoding, draft weights are now counted.",
        ),
    ),
    _r(
        "not_enough_memory",
        "no_kv_room",
        Source(
            _POOLCFG, "Not enough memory. Please try to increase --mem-fraction-static.", "plain"
        ),
    ),
    _r("pool_too_small", "pool_too_small", Source(_TP, "Memory pool size is too small", "plain")),
    _r("mrr_zero", "pool_too_small", Source(_TP, "max_running_request is zero", "plain")),
    _r(
        "host_memory",
        "host_memory",
        Source(
            _HOST,
            "Not enough host memory available. Requesting "
            "{requested_bytes / 1000000000.0:.2f} GB but only have "
            "{available_bytes / 1000000000.0:.2f} GB free. Please reduce the size of the "
            "hierarchical cache.",
        ),
    ),
    _r(
        "host_memory_none_left",
        "host_memory",
        Source(
            _AUTO,
            "No host memory is left for HiCache after the 10 GiB reserve; set --hicache-ratio or "
            "--hicache-size explicitly.",
            "plain",
        ),
    ),
    _r(
        "prefill_oom",
        "prefill_oom",
        Source(
            _ALLOC,
            "Prefill out of memory. Try to lower your batch size.\n"
            "Try to allocate {extend_num_tokens} tokens.\n"
            "{available_and_evictable_str(tree_cache)}",
        ),
    ),
    _r(
        "decode_oom",
        "decode_oom",
        Source(
            _ALLOC,
            "Decode out of memory. Try to lower your batch size.\n"
            "Try to allocate {len(seq_lens) * token_per_req} tokens.\n"
            "{available_and_evictable_str(tree_cache)}",
        ),
    ),
    _r(
        "alloc_oom",
        "alloc_oom",
        Source(
            _ALLOC,
            "Out of memory. Try to lower your batch size.\n"
            "Try to allocate {num_tokens} tokens.\n{available_and_evictable_str(tree_cache)}",
        ),
    ),
    _r(
        "req_slots_oom",
        "req_slots_oom",
        Source(
            _ALLOC,
            "alloc_req_slots runs out of memory. Please set a smaller number for "
            "`--max-running-requests`. "
            "req_to_token_pool.available_size()={req_to_token_pool.available_size()!r}, "
            "num_reqs={num_reqs!r}, ",
        ),
    ),
    _r(
        "deepgemm_shrink_is_not_an_oom",
        "",
        Source(
            _GEMM,
            "Available memory {memory_budget}GB is less than required memory "
            "{required_memory}GB for warmup, reducing max_m to {max_m} to avoid out of memory",
        ),
    ),
    _r(
        "scheduler_exception",
        "scheduler_exception",
        Source(_SCHED, "Scheduler hit an exception: {traceback}"),
    ),
    _r(
        "watchdog_timeout",
        "watchdog_timeout",
        Source(
            _WATCHDOG,
            "{self.debug_name} watchdog timeout (self.watchdog_timeout={self.watchdog_timeout!r}, "
            "self.soft={self.soft!r})",
        ),
    ),
    _r(
        "rank_died",
        "rank_dead",
        Source(
            _ENGINE,
            "Rank {rank} scheduler died during initialization (exit code: {proc.exitcode}). "
            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check.",
        ),
    ),
    _r(
        "subprocess_crashed",
        "subprocess_crashed",
        Source(
            _WATCHDOG,
            "Subprocess {name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. "
            "Triggering SIGQUIT for cleanup...",
        ),
    ),
    _r(
        "scheduler_terminated",
        "subprocess_crashed",
        Source(
            _ENGINE,
            "Scheduler or DataParallelController {proc.pid} terminated with {proc.exitcode}",
        ),
    ),
    _r(
        "sigquit",
        "sigquit",
        Source(
            _TOK,
            "SIGQUIT received. signum={signum!r}, frame={frame!r}. It usually means one child "
            "failed.",
        ),
    ),
    _r(
        "sigquit_launch",
        "sigquit",
        Source(
            _ENGINE,
            "Received sigquit from a child process. It usually means the child failed.",
            "plain",
        ),
    ),
    _r(
        "warmup_failed",
        "warmup_failed",
        Source(_HTTP, "Initialization failed. warmup error: {last_traceback}"),
    ),
    _r(
        "init_failed",
        "error",
        Source(_ENGINE, "Initialization failed. Please see the error messages above.", "plain"),
    ),
    _r(
        "sigterm",
        "sigterm_received",
        Source(
            _TOK,
            "SIGTERM received. signum={signum!r} frame={frame!r}. Draining requests and shutting "
            "down...",
        ),
    ),
    _r(
        "sigterm_force_exit",
        "sigterm_received",
        Source(_TOK, "Signal SIGTERM received while health check failed. Force exiting.", "plain"),
    ),
    _r(
        "graceful_exit",
        "graceful_exit",
        Source(
            _TOK,
            "Gracefully exiting... Remaining number of requests {remain_num_req}. Remaining "
            "requests remaining_rids={remaining_rids!r}.",
        ),
    ),
    _r(
        "health_check_failed",
        "health_check_failed",
        Source(
            _HTTP,
            "Health check failed. Server couldn't get a response from detokenizer for last "
            "{HEALTH_CHECK_TIMEOUT} seconds. tic start time: {tic_time}. "
            "last_heartbeat time: {last_receive_time}",
        ),
    ),
    _r(
        "deepgemm_jit",
        "deepgemm_jit",
        Source(_GEMM, "Entering DeepGEMM JIT Pre-Compile session. ", "prefix"),
    ),
)
"""Every 0.5.23 line the ledger and outcome rules read. "prefix" marks a text checked as the
start of a longer literal."""
