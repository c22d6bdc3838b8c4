"""Run in the Python that has SGLang 0.5.23 (never imported by the test suite itself): build
`/server_info` and a finished `/generate` reply with SGLang's own response code, fed the numbers a
simulated server reported, and print both as JSON.

The code that shapes the responses is SGLang's: `http_server.server_info`, `build_server_info`,
`Scheduler.get_init_info`, `SchedulerInternalStateController.get_internal_state`,
`build_memory_usage`, `build_scheduler_startup_time` / `build_engine_startup_time`, and
`TokenizerManager._handle_batch_output` (meta_info). What a GPU process would hand that code is
stood in for: the scheduler, tokenizer manager and runtime-context accessors are plain objects
carrying the simulator's numbers, the ServerArgs are SGLang's own, parsed from the simulator's
launch command. The only module stand-in is the empty `torchvision` package the 0.5.23 CPU
wheel set needs (SGLang's VLM configs import it; nothing here runs a model). A module that does
not import in this venv (a dependency it lacks) is reported as `{"skip": reason}`.

Input on stdin: {"launch_command": str, "spec": bool, "tp": int, "numbers": {...},
"generate": {...}, "flagdump": path} (see `payload_from` in test_oracle_sglang.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
import types
from array import array
from typing import Any


def _stub_torchvision(flagdump: str) -> None:
    """The flag dumper's torchvision stand-in (`autotune/sim/flagdump.py`, loaded by path: it
    imports nothing of autotune, which this Python lacks)."""
    spec = importlib.util.spec_from_file_location("flagdump", flagdump)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.stub_torchvision()


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


def main() -> None:
    given = json.loads(sys.stdin.read())
    _stub_torchvision(given["flagdump"])
    try:
        import msgspec
        import sglang.srt.entrypoints.http_server as hs
        import sglang.srt.managers.scheduler as sched_mod
        import sglang.srt.managers.scheduler_components.internal_state as ist
        import sglang.srt.managers.tokenizer_manager as tm
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.io_struct import (
            BatchStrOutput,
            GenerateReqInput,
            GetInternalStateReq,
        )
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.observability.startup_time import (
            build_engine_startup_time,
            build_scheduler_startup_time,
        )
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except ImportError as exc:
        print(json.dumps({"skip": f"SGLang's response code does not import here: {exc}"}))
        return

    n = given["numbers"]
    spec = given["spec"]
    server_args = prepare_server_args(given["launch_command"].split())
    resolved = server_args.resolved_dict()

    # The runtime context a published GPU process would have.
    ist.get_context = lambda: ns(resolved_server_args_dict=lambda: dict(resolved))
    ist.get_parallel = lambda: ns(dp_size=1, tp_size=given["tp"], pp_size=1)
    ist.get_exec = lambda: ns(moe=ns(elastic_ep_backend=None))
    sched_mod.get_serving = lambda: ns(grpc_port=None, smg_grpc_mode=False, grpc_mode=False)

    target_graphs = {k: v for k, v in n["graph"].items() if not k.startswith("draft_")}
    draft_graphs = {k: v for k, v in n["graph"].items() if k.startswith("draft_")}
    scheduler_startup = build_scheduler_startup_time(
        target_load_weight=n["load_weight"],
        draft_load_weight=0.0,
        kv_cache_allocation=n["kv_cache_allocation"],
        scheduler_e2e=n["scheduler_e2e"],
        target_cuda_graph=target_graphs,
        draft_cuda_graph=draft_graphs,
    )
    reporter = ns(
        last_gen_throughput=0.0,
        spec_total_num_forward_ct=10 if spec else 0,
        spec_total_num_accept_tokens=25 if spec else 0,
        step_time_dict={},
    )
    tp_worker = ns(
        model_runner=ns(weight_load_mem_usage=n["weight"]),
        graph_memory_usage=target_graphs,
        get_decode_cuda_graph_bs=lambda: list(n["decode_bs"]),
    )
    scheduler = ns(
        tp_worker=tp_worker,
        draft_worker=ns(graph_memory_usage=draft_graphs) if spec else None,
        token_to_kv_pool_allocator=ns(get_kvcache=lambda: ns(mem_usage=n["kvcache"])),
        startup_available_gpu_memory_gb=n["startup_available"],
        max_total_num_tokens=n["max_total_num_tokens"],
        max_req_input_len=n["max_req_input_len"],
        swa_tokens_per_layer=None,
        startup_time=scheduler_startup,
        max_running_requests=n["max_running_requests"],
        metrics_reporter=reporter,
        disaggregation_mode=DisaggregationMode.NULL,
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3" if spec else None),
        rust_server=None,
        enable_hierarchical_cache=n["hicache"],
        page_size=n["page_size"],
        tree_cache=ns(cache_controller=ns(storage_backend=None, storage_backend_type=None)),
    )
    scheduler._hicache_l3_layout = lambda: sched_mod.Scheduler._hicache_l3_layout(scheduler)
    controller = ist.SchedulerInternalStateController(scheduler, record_step_time=False)
    internal = controller.get_internal_state(GetInternalStateReq()).internal_state
    init_info = sched_mod.Scheduler.get_init_info(scheduler)

    async def get_internal_state() -> list[Any]:
        return [internal]

    tokenizer_manager = ns(
        get_internal_state=get_internal_state,
        server_args=server_args,
        startup_time=build_engine_startup_time(
            [scheduler_startup], tokenizer_e2e=n["tokenizer_e2e"]
        ),
    )
    hs._global_state = ns(tokenizer_manager=tokenizer_manager, scheduler_info=init_info)
    info = asyncio.run(hs.server_info())

    g = given["generate"]
    tm.get_serving = lambda: ns(batch_notify_size=16)
    tm.get_spec = lambda: ns(
        speculative_algorithm="EAGLE3" if spec else None, speculative_num_draft_tokens=4
    )
    obj = GenerateReqInput(text="a b c", sampling_params={"max_new_tokens": g["completion"]})
    stats = tm.APIServerReqTimeStats()
    stats.created_time = time.perf_counter() - 0.5
    state = tm.ReqState(
        out_list=[], finished=False, event=asyncio.Event(), obj=obj, time_stats=stats
    )
    fake_tm = ns(
        rid_to_state={"r1": state},
        enable_metrics=False,
        incremental_streaming_output=False,
        skip_tokenizer_init=False,
        dump_requests_folder=None,
        crash_dump_folder=None,
        config_value=lambda key: "default",
        _get_scheduler_first_token_time=lambda *a: None,
        _release_lora_once=lambda s: None,
    )
    fake_tm._calculate_spec_decoding_metrics = (
        tm.TokenizerManager._calculate_spec_decoding_metrics.__get__(fake_tm)
    )
    fields: dict[str, Any] = {
        "rids": ["r1"],
        "finished_reasons": [FINISH_LENGTH(g["completion"]).to_json()],
        "output_strs": ["x" * g["completion"]],
        "output_ids": [array("i", range(g["completion"]))],
        "prompt_tokens": [g["prompt"]],
        "completion_tokens": [g["completion"]],
        "reasoning_tokens": [0],
        "cached_tokens": [0],
        "retraction_counts": [0],
    }
    if spec:
        fields.update(
            spec_verify_ct=[g["verify_ct"]],
            spec_num_correct_drafts=[g["correct"]],
            spec_correct_drafts_histogram=[g["histogram"]],
        )
    for f in msgspec.structs.fields(BatchStrOutput):
        if f.required and f.name not in fields:
            fields[f.name] = None
    asyncio.run(tm.TokenizerManager._handle_batch_output(fake_tm, BatchStrOutput(**fields)))
    print(json.dumps({"server_info": info, "generate": state.out_list[-1]}, default=repr))


if __name__ == "__main__":
    main()
