"""The scheduler in-process: admission, chunked prefill, retraction, cache hits, runtime OOM."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import re

from autotune.sim.flags import ServerSettings
from autotune.sim.logwriter import LogWriter
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Profile, load_profile
from autotune.sim.scheduler import Request, Scheduler


def fast_profile() -> Profile:
    prof = load_profile("qwen3-32b-h200")
    timing = dataclasses.replace(
        prof.timing, prefill_base_ms=0.2, prefill_ms_per_token=0.0, decode_base_ms=0.2,
        decode_ms_per_seq=0.0, variation=0.0,
    )  # fmt: skip
    return dataclasses.replace(prof, timing=timing)


def run(settings: ServerSettings, reqs: list[Request], profile: Profile | None = None,
        seed: int = 0) -> tuple[str, list[str]]:  # fmt: skip
    prof = profile or fast_profile()
    plan = plan_startup(prof, settings)
    out = io.StringIO()
    fatal: list[str] = []

    async def main() -> None:
        sch = Scheduler(
            prof, plan, seed=seed, log=LogWriter(1, stream=out), decode_log_interval=4,
            schedule_conservativeness=settings.schedule_conservativeness,
            on_oom=lambda kind, peak, free: fatal.append(f"{kind} {peak:.2f} {free:.2f}"),
        )  # fmt: skip
        task = asyncio.create_task(sch.run())
        for r in reqs:
            sch.submit(r)
        for _ in range(20_000):
            if all(r.finished for r in reqs) or fatal:
                break
            await asyncio.sleep(0.001)
        sch.stop()
        task.cancel()

    asyncio.run(main())
    return out.getvalue(), fatal


def req(i: int, n_in: int, n_out: int, prefix: int = 0) -> Request:
    base = (prefix or i) * 100_000
    ids = [base + t for t in range(n_in)]
    return Request(f"r{i}", ids, n_out)


def test_chunked_prefill_splits_long_prompts() -> None:
    s = ServerSettings(model_path="m", chunked_prefill_size=1024)
    log, fatal = run(s, [req(1, 2500, 3)])
    assert not fatal
    tokens = [int(x) for x in re.findall(r"#new-token: (\d+)", log)]
    assert tokens[:3] == [1024, 1024, 452]


def test_max_running_requests_limits_the_batch() -> None:
    s = ServerSettings(model_path="m", max_running_requests=2)
    reqs = [req(i, 20, 12) for i in range(5)]
    log, _ = run(s, reqs)
    assert all(r.finished and len(r.output_ids) == 12 for r in reqs)
    running = [int(x) for x in re.findall(r"Decode batch, #running-req: (\d+)", log)]
    assert running and max(running) <= 2


def test_retraction_when_decode_runs_out_of_pool() -> None:
    s = ServerSettings(model_path="m", max_total_tokens=400, schedule_conservativeness=0.05)
    reqs = [req(i, 60, 100) for i in range(4)]
    log, _ = run(s, reqs)
    assert "KV cache pool is full. Retract requests. #retracted_reqs: " in log
    assert all(len(r.output_ids) == 100 for r in reqs)
    assert sum(r.retractions for r in reqs) > 0


def test_prefix_cache_hit_is_reported() -> None:
    prof = fast_profile()
    plan = plan_startup(prof, ServerSettings(model_path="m"))
    out = io.StringIO()
    a, b = req(1, 200, 2, prefix=7), req(2, 200, 2, prefix=7)

    async def one_after_another() -> None:
        sch = Scheduler(prof, plan, seed=0, log=LogWriter(1, stream=out))
        task = asyncio.create_task(sch.run())
        for r in (a, b):
            sch.submit(r)
            while not r.finished:
                await asyncio.sleep(0.001)
        sch.stop()
        task.cancel()

    asyncio.run(one_after_another())
    assert a.cached_tokens == 0
    assert b.cached_tokens == 192  # whole 16-token blocks of the 199 matchable tokens
    assert "#new-token: 8, #cached-token: 192" in out.getvalue()


def test_runtime_oom_when_transient_exceeds_free_memory() -> None:
    prof = load_profile("kimi-k2.5-tp8-96g")
    fast = dataclasses.replace(prof, timing=fast_profile().timing)
    s = ServerSettings(
        model_path="m", tp_size=8, mem_fraction_static=0.93, max_running_requests=48,
        chunked_prefill_size=8192, speculative_algorithm="EAGLE3",
        speculative_draft_model_path="d",
    )  # fmt: skip
    _, fatal = run(s, [req(1, 9000, 4)], profile=fast)
    assert fatal and fatal[0].startswith("oom")
    safe = dataclasses.replace(s, mem_fraction_static=0.88)
    _, fatal = run(safe, [req(1, 9000, 4)], profile=fast)
    assert not fatal


def test_host_tier_serves_an_evicted_prefix() -> None:
    prof = fast_profile()
    s = ServerSettings(
        model_path="m", max_total_tokens=600, enable_hierarchical_cache=True, hicache_ratio=4.0
    )
    plan = plan_startup(prof, s)
    assert plan.host_cache_tokens == 2401
    first = req(1, 320, 2, prefix=3)
    fillers = [req(10 + i, 320, 2) for i in range(3)]
    again = req(2, 320, 2, prefix=3)
    out = io.StringIO()
    loaded: list[int] = []

    async def sequence() -> None:
        sch = Scheduler(prof, plan, seed=0, log=LogWriter(1, stream=out))
        task = asyncio.create_task(sch.run())
        for r in (first, *fillers, again):
            sch.submit(r)
            while not r.finished:
                await asyncio.sleep(0.001)
        loaded.append(sch.cache.loaded_back_total)
        sch.stop()
        task.cancel()

    asyncio.run(sequence())
    assert again.cached_tokens == 304
    assert loaded[0] > 0  # came back from host memory, not from the GPU pool
