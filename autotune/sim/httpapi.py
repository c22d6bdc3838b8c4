"""SGLang's HTTP API on aiohttp: health, info, native /generate, OpenAI routes, cache, metrics.

Handlers submit requests to the Scheduler and wait on each request's event; every wake-up sends
one SSE chunk carrying whatever the last step produced (cumulative text for /generate, deltas for
the OpenAI routes), so the cost per token stays a dict and a write. Access lines are printed in
uvicorn's format. Routes, payloads and status codes follow reference §5; `/server_info` and the
`/generate` meta_info take the simulated release's shape (0.5.23: the resolved server args, one
internal state per DP rank with a per-phase graph memory dict, `num_retractions`).

It owns `ServerState`, what the HTTP side shares with the server process, so that a client of
the tuner sees what it would see from SGLang. The `/metrics` text comes from `metrics`, which is
handed plain values and so does not depend on this module; the OpenAI routes' reply and stream
documents come from `openaidocs`, which reads only the request.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from autotune.sim import tokens
from autotune.sim.flags import NEWER_SETTINGS, ServerSettings
from autotune.sim.logwriter import LogWriter
from autotune.sim.metrics import render_metrics
from autotune.sim.openaidocs import OpenAiDocs, sse_data
from autotune.sim.profiles import Profile
from autotune.sim.scheduler import Request, Scheduler
from autotune.sim.startupplan import StartupPlan
from autotune.sim.versions import DEFAULT, SglangVersion

HEALTH_CHECK_TIMEOUT_S = 20.0
VERSION = "0.5.9"  # the default release; a server answers with its own (ServerState.release)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ServerState:
    """What the HTTP side needs to know about the server (mutable: status changes)."""

    settings: ServerSettings
    profile: Profile
    plan: StartupPlan
    scheduler: Scheduler
    log: LogWriter
    faults: frozenset[str] = frozenset()
    status: str = "Starting"  # Starting | Up | UnHealthy | ShuttingDown
    first_request_seen: bool = False
    on_first_request: Callable[[], None] | None = None
    release: SglangVersion = DEFAULT
    resolved_args: dict[str, Any] | None = None
    """0.5.23's resolved server-args dict (what its startup line printed)."""
    launch_command: str = ""
    startup_time: dict[str, Any] | None = None
    """The engine-level startup_time dict (0.5.23)."""

    @property
    def model_name(self) -> str:
        """The model's name as the OpenAI routes report and check it: `--served-model-name`, else
        the path."""
        return self.settings.served_model_name or self.settings.model_path


class BadRequest(Exception):
    """The request is refused; `status` is the HTTP status SGLang answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": "BadRequestError", "code": status},
        status=status,
    )


def build_app(state: ServerState) -> web.Application:
    """The aiohttp application with SGLang's routes (health, info, native and OpenAI generation,
    cache, metrics) behind the access-log and API-key middlewares."""
    api = _Api(state)
    app = web.Application(middlewares=[api.access_log, api.auth], client_max_size=1 << 28)
    r = app.router
    r.add_get("/health", api.health)
    r.add_get("/health_generate", api.health)
    r.add_get("/ping", api.ping)
    r.add_get("/model_info", api.model_info)
    r.add_get("/get_model_info", api.model_info)
    r.add_get("/server_info", api.server_info)
    r.add_get("/get_server_info", api.server_info)
    r.add_get("/v1/models", api.models)
    r.add_post("/generate", api.generate)
    r.add_put("/generate", api.generate)
    r.add_post("/v1/completions", api.completions)
    r.add_post("/v1/chat/completions", api.chat)
    r.add_get("/flush_cache", api.flush_cache)
    r.add_post("/flush_cache", api.flush_cache)
    r.add_get("/metrics", api.metrics)
    return app


class _Api:
    def __init__(self, state: ServerState) -> None:
        self.s = state
        self.counter = 0

    # ---- middlewares --------------------------------------------------------------------------

    @web.middleware
    async def access_log(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            peer = request.remote or "127.0.0.1"
            port = 0
            if request.transport is not None:
                info = request.transport.get_extra_info("peername")
                if isinstance(info, tuple) and len(info) >= 2:
                    port = int(info[1])
            self.s.log.access(f"{peer}:{port}", request.method, request.path_qs, status)

    @web.middleware
    async def auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.s.settings.api_key
        path = request.path
        exempt = path.startswith("/health") or path.startswith("/metrics")
        if key and not exempt and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ---- health and info ----------------------------------------------------------------------

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="pong")

    async def health(self, request: web.Request) -> web.StreamResponse:
        s = self.s
        if "health-empty" in s.faults and s.status == "Up":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)
        if "health-fail" in s.faults and s.status == "Up":
            return web.Response(status=503)
        if s.status != "Up":
            return web.Response(status=503)
        tic = time.perf_counter()
        req = Request(f"HEALTH_CHECK_{uuid.uuid4().hex}", [0], 1, health=True)
        s.scheduler.submit(req)
        deadline = tic + HEALTH_CHECK_TIMEOUT_S
        while time.perf_counter() < deadline:
            await asyncio.sleep(1)
            if s.scheduler.last_receive > tic:
                return web.Response(status=200)
            if s.status != "Up":
                return web.Response(status=503)
        s.log.main(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{HEALTH_CHECK_TIMEOUT_S:.0f} seconds. tic start time: "
            f"{time.strftime('%H:%M:%S')}. last_heartbeat time: {time.strftime('%H:%M:%S')}"
        )
        s.status = "UnHealthy"
        return web.Response(status=503)

    async def model_info(self, request: web.Request) -> web.Response:
        m = self.s.profile.model
        return web.json_response(
            {
                "model_path": self.s.settings.model_path,
                "tokenizer_path": self.s.settings.tokenizer_path or self.s.settings.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": m.model_type,
                "architectures": [m.architecture],
            }
        )

    def _resolved_args(self) -> dict[str, Any]:
        st = self.s.settings
        p = self.s.plan
        args: dict[str, Any] = {
            k: v
            for k, v in st.__dict__.items()
            if k != "noted" and not k.startswith("_") and k not in NEWER_SETTINGS
        }
        args.update(dict(st.noted))
        args.update(
            {
                "mem_fraction_static": p.mem_fraction_static,
                "chunked_prefill_size": p.chunked_prefill_size,
                "cuda_graph_max_bs": p.cuda_graph_max_bs,
                "cuda_graph_bs": list(p.capture_bs) or None,
                "page_size": p.page_size,
                "context_length": st.context_length,
                "max_running_requests": p.max_running_requests,
                "kv_cache_dtype": st.kv_cache_dtype,
                "served_model_name": self.s.model_name,
                "speculative_num_steps": p.spec_steps or None,
                "speculative_eagle_topk": p.spec_topk or None,
                "speculative_num_draft_tokens": p.spec_draft_tokens or None,
            }
        )
        return args

    async def server_info(self, request: web.Request) -> web.Response:
        if "bad-server-info" in self.s.faults:
            return web.json_response({"status": "ready", "model_path": self.s.model_name})
        if self.s.release.graph_memory_per_phase:
            return web.json_response(self._server_info_0523())
        p = self.s.plan
        sch = self.s.scheduler
        args = self._resolved_args()
        internal = dict(args)
        internal.update(
            {
                "last_gen_throughput": sch.stats.gen_throughput,
                "memory_usage": {
                    "weight": round(p.weights_gib, 2),
                    "kvcache": round(p.kv_gib or 0.0, 2),
                    "token_capacity": p.max_total_num_tokens,
                    "graph": round(p.graph_gib or 0.0, 2),
                },
                "effective_max_running_requests_per_dp": p.max_running_requests,
            }
        )
        if p.spec:
            internal["avg_spec_accept_length"] = sch.stats.spec_accept_length
        doc = dict(args)
        doc.update(
            {
                "status": "ready" if self.s.status == "Up" else self.s.status.lower(),
                "max_total_num_tokens": p.max_total_num_tokens,
                "max_req_input_len": p.max_req_input_len,
                "internal_states": [internal],
                "version": VERSION,
            }
        )
        return web.json_response(doc)

    def _server_info_0523(self) -> dict[str, Any]:
        """0.5.23 http_server.server_info: build_server_info (resolved args, launch command,
        the rank-0 scheduler's init info, kv_events), the engine startup times, the internal
        state of each DP rank, the version and the frontend."""
        st = self.s
        p = st.plan
        sch = st.scheduler
        args = dict(st.resolved_args or {})
        startup = dict(st.startup_time or {})
        scheduler_startup = {k: v for k, v in startup.items() if k != "tokenizer_e2e"}
        page = p.page_size
        reason = (
            "Mooncake storage is not attached"
            if st.settings.enable_hierarchical_cache
            else ("Hierarchical cache is disabled")
        )
        layout: dict[str, Any] = {
            "enabled": False,
            "backend": None,
            "page_size": page,
            "hicache_object_layout": {"pools": []},
            "reason": reason,
        }
        doc: dict[str, Any] = dict(args)
        doc["launch_command"] = st.launch_command
        doc.update(
            {
                "status": "ready",
                "max_total_num_tokens": p.max_total_num_tokens,
                "max_req_input_len": p.max_req_input_len,
                "startup_time": scheduler_startup,
                "hicache_object_layout": layout,
            }
        )
        doc["kv_events"] = None
        graph = {phase: round(gib, 3) for phase, gib in p.graph_phases().items()}
        internal: dict[str, Any] = {k: v for k, v in args.items() if k != "custom_sigquit_handler"}
        internal.update(
            {
                "world_size": st.settings.tp_size * st.settings.pp_size * st.settings.dp_size,
                "startup_time": scheduler_startup,
                "effective_max_running_requests_per_dp": p.max_running_requests,
                "last_gen_throughput": sch.stats.gen_throughput,
                "memory_usage": {
                    "weight": round(p.weights_gib, 3),
                    "kvcache": round(p.kv_gib or 0.0, 3),
                    "startup_available": round(p.avail_final_gib or 0.0, 3),
                    "token_capacity": int(p.max_total_num_tokens or 0),
                    "token_capacity_swa": None,
                    "graph": graph,
                },
                "disaggregation_mode": "null",
                "decode_cuda_graph_bs": list(p.capture_bs),
                "decode_cuda_graph_memory_gb": round(
                    sum(
                        graph[k]
                        for k in ("decode", "target_verify", "draft_decode", "draft_extend")
                    ),
                    3,
                ),
            }
        )
        if p.spec and sch.stats.spec_forward_total > 0:
            stats = sch.stats
            internal["avg_spec_accept_length"] = stats.spec_accept_total / stats.spec_forward_total
        ranks = max(1, st.settings.dp_size)
        doc.update(
            {
                "startup_time": startup,
                "internal_states": [dict(internal) for _ in range(ranks)],
                "version": st.release.name,
                "frontend": "python",
            }
        )
        return doc

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.s.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.s.model_name,
                        "parent": None,
                        "max_model_len": self.s.plan.context_len,
                    }
                ],
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        sch = self.s.scheduler
        if sch.flush():
            self.s.log.rank(0, "Cache flushed successfully!")
            return web.Response(
                text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n"
            )
        self.s.log.rank(
            0,
            "Cache not flushed because there are pending requests. "
            f"#queue-req: {sch.queued}, #running-req: {len(sch.running)}",
        )
        return web.Response(
            status=400,
            text="Cache flush failed. There are pending requests.\n",
        )

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.s.settings.enable_metrics:
            raise web.HTTPNotFound()
        s = self.s
        text = render_metrics(
            model_name=s.model_name,
            max_total_num_tokens=s.plan.max_total_num_tokens or 0,
            stats=s.scheduler.stats,
            loaded_back_tokens=s.scheduler.cache.loaded_back_total,
            backed_up_tokens=s.scheduler.cache.backed_up_total,
        )
        return web.Response(text=text, content_type="text/plain")

    # ---- generation ---------------------------------------------------------------------------

    def _new_request(
        self, ids: list[int], max_new: int | None, ignore_eos: bool, rid: str | None
    ) -> Request:
        """Admit one prompt (or raise BadRequest) and submit it to the scheduler."""
        self._admit(ids, max_new)
        s = self.s
        self.counter += 1
        req = Request(
            rid or uuid.uuid4().hex,
            ids,
            max_new if max_new is not None else 1 << 30,
            ignore_eos=ignore_eos,
            seed=self.counter,
        )
        if not s.first_request_seen:
            s.first_request_seen = True
            if s.on_first_request is not None:
                s.on_first_request()
        s.scheduler.submit(req)
        return req

    def _admit(self, ids: list[int], max_new: int | None) -> None:
        """SGLang's refusals, in its order: context length, input limit, shutdown, full queue
        (and the `refuse-generate` fault's 500 to every request, first)."""
        s = self.s
        if "refuse-generate" in s.faults:
            raise BadRequest("Internal Server Error", 500)
        ctx = s.plan.context_len
        if len(ids) >= ctx:
            raise BadRequest(
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        if max_new is not None and len(ids) + max_new > ctx:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {len(ids) + max_new} tokens: {len(ids)} tokens "
                f"from the input messages and {max_new} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the "
                "limit."
            )
        limit = s.plan.max_req_input_len or ctx
        if len(ids) >= limit:
            raise BadRequest(
                f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({limit} "
                "tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        if s.status == "ShuttingDown":
            raise BadRequest("The server is shutting down.", 503)
        limit_q = s.settings.max_queued_requests
        if limit_q is not None and s.scheduler.queued >= limit_q:
            raise BadRequest("The request queue is full.", 503)

    async def _wait(self, req: Request) -> None:
        while not req.finished:
            await req.event.wait()
            req.event.clear()

    def _meta(self, req: Request) -> dict[str, Any]:
        release = self.s.release
        finish: dict[str, Any] | None = None
        if req.finished:
            if req.finish_reason == "abort":
                finish = {"type": "abort", "message": req.error or "aborted"}
                if release.reasoning_tokens:
                    finish.update({"status_code": None, "err_type": None})
            else:
                finish = {"type": "length", "length": len(req.output_ids)}
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": "default",
        }
        if release.reasoning_tokens:
            meta[release.retractions_key] = req.retractions
            meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = len(req.output_ids)
        meta["cached_tokens"] = req.cached_tokens
        if not release.reasoning_tokens:
            meta[release.retractions_key] = req.retractions
        if req.finished and req.finished_at is not None:
            meta["e2e_latency"] = req.finished_at - req.created
            if release.reasoning_tokens and self.s.plan.spec:
                meta.update(self._spec_meta(req))
        return meta

    def _spec_meta(self, req: Request) -> dict[str, Any]:
        """0.5.23 `_calculate_spec_decoding_metrics`: a finished request's speculative counts."""
        out: dict[str, Any] = {}
        proposed = req.verify_ct * max(self.s.plan.spec_draft_tokens - 1, 0)
        if req.verify_ct > 0 and proposed > 0:
            out.update(
                {
                    "spec_accept_rate": req.correct_drafts / proposed,
                    "spec_accept_length": len(req.output_ids) / req.verify_ct,
                    "spec_num_correct_drafts": req.correct_drafts,
                    "spec_num_proposed_drafts": proposed,
                    "spec_verify_ct": req.verify_ct,
                }
            )
        if any(req.drafts_histogram):
            out["spec_correct_drafts_histogram"] = list(req.drafts_histogram)
        return out

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("Invalid JSON body") from None
        if not isinstance(body, dict):
            raise BadRequest("The request body must be a JSON object")
        return body

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json(request)
            reqs = self._generate_requests(body)
        except BadRequest as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=exc.status)
        batch = isinstance(body.get("text"), list) or (
            isinstance(body.get("input_ids"), list)
            and bool(body["input_ids"])
            and isinstance(body["input_ids"][0], list)
        )
        if body.get("stream") and not batch:
            return await self._stream_generate(request, reqs[0])
        try:
            await asyncio.gather(*(self._wait(r) for r in reqs))
        except asyncio.CancelledError:
            for r in reqs:
                self.s.scheduler.abort(r)
            raise
        outs = [
            {"text": "".join(r.text_parts), "output_ids": r.output_ids, "meta_info": self._meta(r)}
            for r in reqs
        ]
        return web.json_response(outs if batch else outs[0])

    def _generate_requests(self, body: dict[str, Any]) -> list[Request]:
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        max_new = params.get("max_new_tokens", 128)
        if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
            raise BadRequest("max_new_tokens must be a non-negative integer")
        ignore = bool(params.get("ignore_eos", False))
        text = body.get("text")
        ids = body.get("input_ids")
        prompts: list[list[int]]
        if ids is not None:
            if isinstance(ids, list) and ids and isinstance(ids[0], list):
                prompts = [[int(t) for t in one] for one in ids]
            elif isinstance(ids, list):
                prompts = [[int(t) for t in ids]]
            else:
                raise BadRequest("input_ids must be a list of token ids")
        elif isinstance(text, str):
            prompts = [tokens.encode(text)]
        elif isinstance(text, list):
            prompts = [tokens.encode(str(t)) for t in text]
        else:
            raise BadRequest("Either text or input_ids should be provided.")
        if not prompts or any(not p for p in prompts):
            raise BadRequest("The input is empty.")
        rid = body.get("rid")
        return [
            self._new_request(
                p, max_new, ignore, rid if isinstance(rid, str) and len(prompts) == 1 else None
            )
            for p in prompts
        ]

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await resp.prepare(request)
        return resp

    async def _stream_generate(self, request: web.Request, req: Request) -> web.StreamResponse:
        resp = await self._sse(request)
        sent = 0
        try:
            while True:
                await req.event.wait()
                req.event.clear()
                n = len(req.output_ids)
                if n > sent or req.finished:
                    chunk = {
                        "text": "".join(req.text_parts),
                        "output_ids": req.output_ids[sent:n],
                        "meta_info": self._meta(req),
                    }
                    await resp.write(sse_data(chunk))
                    sent = n
                if req.finished:
                    break
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.s.scheduler.abort(req)
            raise
        return resp

    # ---- OpenAI -------------------------------------------------------------------------------

    def _openai_common(self, body: dict[str, Any]) -> tuple[int | None, bool]:
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
            raise BadRequest("max_tokens must be a non-negative integer")
        return max_new, bool(body.get("ignore_eos", False))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json(request)
            max_new, ignore = self._openai_common(body)
            if "max_tokens" not in body and "max_completion_tokens" not in body:
                max_new = 16
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = tokens.encode(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = [int(t) for t in prompt]
            else:
                raise BadRequest("prompt must be a string or a list of token ids")
            req = self._new_request(ids, max_new, ignore, None)
        except BadRequest as exc:
            return _error(str(exc), exc.status)
        return await self._openai_reply(request, body, req, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json(request)
            max_new, ignore = self._openai_common(body)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            rendered = []
            for m in messages:
                if not isinstance(m, dict):
                    raise BadRequest("each message must be an object")
                content = m.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(
                        str(part.get("text", "")) for part in content if isinstance(part, dict)
                    )
                rendered.append(f"<|im_start|>{m.get('role', 'user')}\n{content}<|im_end|>")
            rendered.append("<|im_start|>assistant")
            req = self._new_request(tokens.encode("\n".join(rendered)), max_new, ignore, None)
        except BadRequest as exc:
            return _error(str(exc), exc.status)
        return await self._openai_reply(request, body, req, chat=True)

    async def _openai_reply(
        self, request: web.Request, body: dict[str, Any], req: Request, chat: bool
    ) -> web.StreamResponse:
        docs = OpenAiDocs(
            req.rid, int(time.time()), str(body.get("model") or self.s.model_name), chat
        )
        if not body.get("stream"):
            return await self._openai_whole(req, docs)
        opts = body.get("stream_options") or {}
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        return await self._openai_stream(request, req, docs, include_usage)

    async def _openai_whole(self, req: Request, docs: OpenAiDocs) -> web.Response:
        """The non-streaming reply: wait for the request to finish, answer one document."""
        try:
            await self._wait(req)
        except asyncio.CancelledError:
            self.s.scheduler.abort(req)
            raise
        return web.json_response(docs.reply(req))

    async def _openai_stream(
        self, request: web.Request, req: Request, docs: OpenAiDocs, include_usage: bool
    ) -> web.StreamResponse:
        """SSE deltas, one chunk per wake-up, then the finish chunk, usage if asked, [DONE]."""
        resp = await self._sse(request)
        sent = 0
        try:
            if docs.chat:
                await resp.write(docs.chunk("", None, first=True))
            while True:
                await req.event.wait()
                req.event.clear()
                n = len(req.text_parts)
                if n > sent:
                    await resp.write(docs.chunk("".join(req.text_parts[sent:n]), None))
                    sent = n
                if req.finished:
                    break
            reason = "abort" if req.finish_reason == "abort" else "length"
            await resp.write(docs.chunk(None if docs.chat else "", reason))
            if include_usage:
                await resp.write(docs.usage_chunk(req))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.s.scheduler.abort(req)
            raise
        return resp
