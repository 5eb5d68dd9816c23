"""The simulator's HTTP shell: vLLM's OpenAI server routes on aiohttp, around the pure engine.

One background task steps the engine: it runs queued utility calls (adapter loads, which stall
the engine as vLLM's ``add_lora`` does), calls ``Engine.step()``, sleeps the step's simulated
duration times ``time_scale`` and only then hands the step's tokens to the request handlers,
so nobody sees a token before its step has "finished". Handlers wait on one future each;
streaming handlers write whatever tokens arrived since their last write as one SSE chunk
(vLLM's output collector merges outputs the same way when a client lags).

Called by ``lorapool.sim.cli``; tests start it as a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from lorapool import __version__
from lorapool.api.vllm_metrics import FAMILIES
from lorapool.api.vllm_versions import CPU_TIER, SUPPORTED, VllmRelease
from lorapool.sim import protocol
from lorapool.sim.adapters import AdapterLoadError, read_adapter
from lorapool.sim.engine import (
    FINISHED,
    AdapterRef,
    Engine,
    EngineConfig,
    EngineStats,
    LoadEvent,
    SimRequest,
    StepResult,
)
from lorapool.sim.metrics import CONTENT_TYPE, SimMetrics
from lorapool.sim.protocol import RequestError
from lorapool.sim.text import block_hashes, lora_salt, natural_output_tokens, output_text, request_seed
from lorapool.sim.timing import TimingParams
from lorapool.sources.verify import BaseShape

log = logging.getLogger("lorapool.sim")

_SCHEDULE_SLACK_S = 0.005  # a step that wakes up this late keeps the schedule instead of drifting
_JSON = "application/json"


@dataclass(frozen=True)
class LoRAModule:
    """A ``--lora-modules`` entry, loaded before the server accepts requests."""

    name: str
    path: str


@dataclass(frozen=True)
class SimSettings:
    """Everything a simulator process needs, resolved from flags and the profile."""

    host: str
    port: int
    model: str
    served_model_names: tuple[str, ...]
    engine: EngineConfig
    timing: TimingParams
    time_scale: float
    seed: int
    allow_runtime_lora_updating: bool
    lora_modules: tuple[LoRAModule, ...] = ()
    release: VllmRelease = SUPPORTED[CPU_TIER]  # the vLLM release it behaves as (--vllm-version)
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details, as vLLM's flag (off)
    # The served model's shape, read from --model's config.json when it is a directory: adapters are
    # verified against it (sim.adapters); None: config and weights only.
    base_shape: BaseShape | None = None
    # vLLM's --shutdown-timeout (0.32+): what SIGTERM does to the requests in flight (``SimServer.shutdown``).
    shutdown_timeout_s: float = 0.0


class _Waiter:
    """What the stepper tells a handler: tokens visible so far, and whether it is done."""

    __slots__ = ("arrival", "done", "first", "future", "stream", "visible")

    def __init__(self, arrival: float, stream: bool) -> None:
        self.arrival = arrival
        self.stream = stream
        self.visible = 0
        self.first = -1.0
        self.done = False
        self.future: asyncio.Future[None] | None = None


class SimServer:
    """A running simulator: engine, adapter registry, stepping task and aiohttp app."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.engine = Engine(settings.engine, settings.timing)
        family = FAMILIES[settings.release.family]
        self.metrics = SimMetrics(self.engine, settings.served_model_names[0], settings.time_scale, family)
        self.base_names = frozenset(settings.served_model_names)
        self.adapters: dict[str, AdapterRef] = {}
        self._next_lora_id = 1
        self._name_locks: dict[str, asyncio.Lock] = {}
        self._utility: deque[tuple[Callable[[], LoadEvent], asyncio.Future[LoadEvent]]] = deque()
        self._wake = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.failed = asyncio.Event()
        self.draining = False  # SIGTERM came: new generation requests are refused (``shutdown``)
        self._drained = asyncio.Event()  # set by the stepper when draining and nothing is left
        self.port = settings.port
        self.created = int(time.time())

    # -- lifecycle ------------------------------------------------------------------------

    def load_static_adapters(self) -> None:
        """Load ``--lora-modules`` as vLLM's init_static_loras: any failure stops start-up."""
        for module in self.settings.lora_modules:
            if not self.settings.engine.enable_lora:
                raise ValueError("--lora-modules needs --enable-lora")
            if module.name in self.adapters:
                raise ValueError(f"--lora-modules names {module.name!r} twice")
            try:
                ref = self._adapter_ref(module.name, module.path)
            except AdapterLoadError as exc:
                raise ValueError(exc.message) from exc
            self.engine.load_adapter(ref)
            self.adapters[module.name] = ref
        # Start-up loads stall no batch: counters start when serving starts.
        self.engine.stats = EngineStats()
        self.engine.clock_s = 0.0

    async def start(self) -> None:
        self.load_static_adapters()
        app = self.build_app()
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, backlog=1024)
        await site.start()
        if self.settings.port == 0 and self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        self._stepper = asyncio.create_task(self._step_loop(), name="sim-stepper")
        self._stepper.add_done_callback(self._stepper_done)

    async def stop(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def shutdown(self) -> None:
        """SIGTERM as vLLM 0.32+ takes it (its engine core's ``_handle_shutdown``): with
        ``--shutdown-timeout 0`` every request in flight ends at once, answered with what it has and
        finish_reason ``abort``; with N > 0 new requests are refused (500, vLLM's words) while those in
        flight finish for up to N wall seconds, and what is left then is aborted. Then the server stops.
        The timeout is wall time, not scaled: it is the pod's, not the model's."""
        self.draining = True
        if self.engine.has_work and self.settings.shutdown_timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.settings.shutdown_timeout_s)
        self._abort_in_flight()
        await self.stop()

    def _abort_in_flight(self) -> None:
        """End every unfinished request as aborted and wake its handler, which answers with it."""
        for req in [*self.engine.running, *self.engine.waiting]:
            self.engine.abort(req)
            waiter: _Waiter = req.handle
            waiter.visible, waiter.done = req.generated, True
            if waiter.future is not None and not waiter.future.done():
                waiter.future.set_result(None)

    def _stepper_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("Engine stepper failed", exc_info=task.exception())
            self.failed.set()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        routes: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
            ("GET", "/health", self.health),
            ("GET", "/ping", self.health),  # SageMaker's health route, which vLLM serves too
            ("POST", "/ping", self.health),
            ("GET", "/version", self.version),
            ("GET", "/metrics", self.metrics_text),
            ("GET", "/v1/models", self.models),
            ("POST", "/v1/completions", self.completions),
            ("POST", "/v1/chat/completions", self.chat_completions),
        ]
        if self.settings.allow_runtime_lora_updating:
            # vLLM registers these only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is true.
            routes += [
                ("POST", "/v1/load_lora_adapter", self.load_lora_adapter),
                ("POST", "/v1/unload_lora_adapter", self.unload_lora_adapter),
            ]
        known = {path for _, path, _ in routes}
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)

        async def not_found(request: web.Request) -> web.Response:
            # FastAPI's bodies, so a client sees what vLLM would send.
            if request.path in known:
                return _json_response({"detail": "Method Not Allowed"}, 405)
            return _json_response({"detail": "Not Found"}, 404)

        app.router.add_route("*", "/{tail:.*}", not_found)
        return app

    # -- the stepping task ----------------------------------------------------------------

    def _kick(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        scale = self.settings.time_scale
        end = loop.time()
        while True:
            if not engine.has_work and not self._utility:
                self._wake.clear()
                await self._wake.wait()
                end = loop.time()
            while self._utility:
                call, future = self._utility.popleft()
                try:
                    event = call()
                except Exception as exc:  # a load that failed after validation
                    if not future.done():
                        future.set_exception(exc)
                    continue
                end = await self._sleep(loop, end, event.seconds * scale)
                if not future.done():
                    future.set_result(event)
            if not engine.has_work:
                continue
            result = engine.step()
            self.metrics.record_step()
            end = await self._sleep(loop, end, result.duration_s * scale)
            self._deliver(result, loop.time())
            if result.num_seqs == 0:
                await asyncio.sleep(0.001)  # nothing schedulable: do not spin

    async def _sleep(self, loop: asyncio.AbstractEventLoop, end: float, delay: float) -> float:
        """Sleep until ``delay`` after the previous deadline; return the new deadline.

        Time the stepper starts late beyond the slack (the simulator's own CPU was the
        bottleneck, not the model) is added to ``sim:schedule_overrun_seconds_total``.
        """
        now = loop.time()
        if delay <= 0:
            await asyncio.sleep(0)
            return now
        if now - end <= _SCHEDULE_SLACK_S:
            start = end
        else:
            start = now
            self.metrics.overrun_s += now - end
        deadline = start + delay
        await asyncio.sleep(deadline - now)
        return deadline

    def _deliver(self, result: StepResult, now: float) -> None:
        ttft, e2e = self.metrics.ttft, self.metrics.e2e
        for req in result.emitted:
            waiter: _Waiter = req.handle
            waiter.visible = req.generated
            if waiter.first < 0:
                waiter.first = now
                ttft.observe(now - waiter.arrival)
            if req.state == FINISHED:
                waiter.done = True
                e2e.observe(now - waiter.arrival)
            elif not waiter.stream:
                continue
            future = waiter.future
            if future is not None and not future.done():
                future.set_result(None)
        if self.draining and not self.engine.has_work:
            self._drained.set()

    async def _run_utility(self, call: Callable[[], LoadEvent]) -> LoadEvent:
        future: asyncio.Future[LoadEvent] = asyncio.get_running_loop().create_future()
        self._utility.append((call, future))
        self._kick()
        return await future

    # -- routes ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        # The release it takes on, so a sidecar or router reads its metrics by that release's row;
        # the local part says it is the simulator (api.vllm_versions.family_name ignores it).
        return _json_response({"version": f"{self.settings.release.version}+lorapool.sim.{__version__}"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def models(self, request: web.Request) -> web.Response:
        s = self.settings
        cards = [
            protocol.model_card(name, self.created, s.model, None, s.engine.max_model_len, uuid.uuid4().hex[:16])
            for name in s.served_model_names
        ]
        cards += [
            protocol.model_card(ref.name, self.created, ref.path, s.served_model_names[0], None, uuid.uuid4().hex[:16])
            for ref in self.adapters.values()
        ]
        return _json_response({"object": "list", "data": cards})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if self.draining:  # what vLLM's API server answers while its engine drains
            return _error(500, "InternalServerError", "cannot schedule new futures after shutdown")
        try:
            gen = protocol.parse_generation(await _read_json(request), chat=chat)
            model, adapter = self._resolve(gen.model)
            max_tokens = protocol.check_context(
                gen.prompt_tokens, gen.max_tokens, self.settings.engine.max_model_len, gen.max_tokens_param
            )
        except RequestError as exc:
            return _error(exc.status, exc.err_type, exc.message, exc.param)
        # The adapter's path is part of the seed: another adapter, or an in-place reload from a
        # new path, answers differently (as new weights would), the same one repeats itself.
        seed_model = model if adapter is None else f"{model}@{adapter.path}"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        loop = asyncio.get_running_loop()
        hashes = self._block_hashes(gen, adapter)
        seqs = [self._sequence(rid, i, gen, seed_model, max_tokens, adapter, hashes, loop.time()) for i in range(gen.n)]
        self._kick()
        try:
            if gen.stream:
                req, waiter, seed = seqs[0]
                return await self._stream(request, req, waiter, gen, model, seed)
            for _, waiter, _ in seqs:
                while not waiter.done:
                    waiter.future = loop.create_future()
                    await waiter.future
        finally:
            for req, _, _ in seqs:
                if req.state != FINISHED:
                    self.engine.abort(req)
        generated = sum(req.generated for req, _, _ in seqs)
        used = self._usage(gen, seqs[0][0], generated, streamed=False)
        choice = protocol.chat_choice if chat else protocol.completion_choice
        choices = [
            choice(i, output_text(seed, 0, req.generated), req.final_reason) for i, (req, _, seed) in enumerate(seqs)
        ]
        build = protocol.chat_completion if chat else protocol.completion
        return _json_response(build(rid, int(time.time()), model, "", "", used, choices=choices))

    def _sequence(
        self,
        rid: str,
        index: int,
        gen: protocol.Generation,
        seed_model: str,
        max_tokens: int,
        adapter: AdapterRef | None,
        hashes: tuple[int, ...],
        now: float,
    ) -> tuple[SimRequest, _Waiter, int]:
        """Queue one output sequence (``n`` > 1 queues n of them, as vLLM's parallel sampling)."""
        timing = self.settings.timing
        seed = request_seed(self.settings.seed, seed_model, gen.prompt, gen.seed)
        if index:
            seed = request_seed(seed, str(index), gen.prompt, gen.seed)
        natural = natural_output_tokens(seed, timing.natural_output_tokens_min, timing.natural_output_tokens_max)
        if gen.ignore_eos or natural >= max_tokens:
            output_tokens, reason = max_tokens, "length"
        else:
            output_tokens, reason = natural, "stop"
        req = SimRequest(
            rid if index == 0 else f"{rid}-{index}",
            gen.prompt_tokens,
            output_tokens,
            reason,
            adapter,
            block_hashes=hashes,
        )
        waiter = _Waiter(now, gen.stream)
        req.handle = waiter
        self.engine.add_request(req)
        return req, waiter, seed

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        waiter: _Waiter,
        gen: protocol.Generation,
        model: str,
        seed: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        created = int(time.time())
        rid = req.request_id
        chunk = protocol.ChunkTemplate(rid, created, model, gen.chat)
        sent = 0
        while True:
            visible = waiter.visible
            if visible > sent:
                payload = b""
                if gen.chat and sent == 0:
                    role = protocol.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None)
                    payload = b"data: " + protocol.dumps(role) + b"\n\n"
                payload += chunk.render(output_text(seed, sent, visible), req.final_reason if waiter.done else None)
                if waiter.done:
                    if gen.include_usage:
                        used = self._usage(gen, req, req.generated, streamed=True)
                        payload += (
                            b"data: "
                            + protocol.dumps(protocol.usage_chunk(rid, created, model, gen.chat, used))
                            + b"\n\n"
                        )
                    payload += b"data: [DONE]\n\n"
                await response.write(payload)
                sent = visible
            if waiter.done:
                break
            waiter.future = loop.create_future()
            await waiter.future
        await response.write_eof()
        return response

    def _block_hashes(self, gen: protocol.Generation, adapter: AdapterRef | None) -> tuple[int, ...]:
        """The prompt's full-block hashes for the engine's prefix cache (none when it is off),
        salted as vLLM salts them: by the adapter's name and path, not at all for the base model."""
        engine = self.settings.engine
        if not engine.enable_prefix_caching:
            return ()
        salt = "" if adapter is None else lora_salt(adapter.name, adapter.path)
        return block_hashes(gen.cache_text, engine.block_size, salt)

    def _usage(self, gen: protocol.Generation, req: SimRequest, generated: int, *, streamed: bool) -> dict[str, Any]:
        """The response's usage; ``prompt_tokens_details`` only with --enable-prompt-tokens-details,
        from the first sequence (as vLLM, which reports one request's cache hit). Chat's
        ``created_cache_tokens``: the prompt's full blocks, now cached, less those it hit."""
        details = None
        if self.settings.enable_prompt_tokens_details:
            created = len(req.block_hashes) * self.settings.engine.block_size - req.cached_tokens if gen.chat else None
            details = protocol.prompt_tokens_details(req.cached_tokens, created, streamed=streamed)
        return protocol.usage(gen.prompt_tokens, generated, details)

    def _resolve(self, model: str | None) -> tuple[str, AdapterRef | None]:
        """The response's model name and the adapter a request selects, or vLLM's 404."""
        if model is None or model in self.base_names:
            return self.settings.served_model_names[0], None
        adapter = self.adapters.get(model)
        if adapter is None:
            aliases = ", ".join(self.settings.served_model_names)
            raise RequestError(
                404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model"
            )
        return model, adapter

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            name, path, inplace = _load_request(body)
        except RequestError as exc:
            return _error(exc.status, exc.err_type, exc.message, exc.param)
        if not name or not path:
            return _error(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.base_names:
            return _error(400, "InvalidUserInput", f"The lora adapter '{name}' conflicts with a served base model.")
        lock = self._name_locks.setdefault(name, asyncio.Lock())
        async with lock:
            existing = self.adapters.get(name)
            if existing is not None and not inplace:
                return _error(
                    400,
                    "InvalidUserInput",
                    f"The lora adapter '{name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True.",
                )
            if not self.settings.engine.enable_lora:
                return _error(400, "BadRequestError", "LoRA is not enabled. Use --enable-lora to enable LoRA.")
            try:
                ref = self._adapter_ref(name, path, existing, inplace=inplace)
            except AdapterLoadError as exc:
                log.info("Refused LoRA adapter name=%s path=%s reason=%r", name, path, exc.message)
                return _error(exc.status, exc.err_type, exc.message)
            event = await self._run_utility(lambda: self.engine.load_adapter(ref, replace=existing is not None))
            if existing is not None and existing.path == path:
                # As vLLM: the prefix cache is salted by name and path, so the old weights' blocks still hit
                log.warning("Reloaded LoRA adapter in place from the same path name=%s path=%s", name, path)
            self.adapters[name] = ref
        log.info("Loaded LoRA adapter name=%s path=%s rank=%d stall_s=%.3f", name, path, ref.rank, event.seconds)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            name = _string_field(body, "lora_name", required=True)
        except RequestError as exc:
            return _error(exc.status, exc.err_type, exc.message, exc.param)
        if not name:
            return _error(400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
        lock = self._name_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self.adapters.pop(name, None) is None:
                return _error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        # As vLLM: the name goes; the engine's caches age the weights out; in-flight requests finish.
        log.info("Unloaded LoRA adapter name=%s", name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _adapter_ref(
        self, name: str, path: str, existing: AdapterRef | None = None, *, inplace: bool = False
    ) -> AdapterRef:
        """``inplace`` on a release whose flag sticks (0.32): the cached request keeps ``load_inplace``,
        so vLLM's worker re-reads the adapter at every step that runs it (``AdapterRef.reread``)."""
        files = read_adapter(
            name, path, max_lora_rank=self.settings.engine.max_lora_rank, base=self.settings.base_shape
        )
        if existing is not None:
            lora_id = existing.lora_id  # load_inplace keeps vLLM's lora_int_id
        else:
            lora_id = self._next_lora_id
            self._next_lora_id += 1
        reread = inplace and self.settings.release.inplace_flag_sticks
        return AdapterRef(lora_id=lora_id, name=name, rank=files.config.rank, path=path, reread=reread)


async def _read_json(request: web.Request) -> Any:
    """The body as JSON, or FastAPI's validation error as vLLM 0.32 answers it ("Bad Request")."""
    if request.content_type != _JSON:
        raise protocol.invalid_body("Unsupported Media Type: Only 'application/json' is allowed", None)
    raw = await request.read()
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        detail = {
            "type": "json_invalid",
            "loc": f"body.{exc.pos}",
            "msg": "JSON decode error",
            "input": "<dict of 0 items>",
            "ctx": {"error": exc.msg},
        }
        raise protocol.invalid_body(repr(detail), f"body.{exc.pos}") from exc
    except ValueError as exc:
        raise protocol.invalid_body(f"JSON decode error: {exc}", "body") from exc


def _load_request(body: Any) -> tuple[str | None, str | None, bool]:
    name = _string_field(body, "lora_name", required=True)
    path = _string_field(body, "lora_path", required=True)
    return name, path, protocol.lax_bool(body, "load_inplace", False)


def _string_field(body: Any, key: str, *, required: bool = False) -> str | None:
    if not isinstance(body, dict):
        raise protocol.not_an_object(body)
    if required and key not in body:
        raise protocol.missing_field(key, body)
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise protocol.wrong_type(key, value, "string_type", "Input should be a valid string")
    return value


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=protocol.dumps(obj), content_type=_JSON)


def _error(status: int, err_type: str, message: str, param: str | None = None) -> web.Response:
    return _json_response(protocol.error_body(message, err_type, status, param), status)
