"""The vLLM runtime-LoRA API as the sidecar uses it: health, list, load, unload.

Every call has a timeout; failures become ``EngineError`` with the HTTP status, a message
that says what to fix and ``permanent``: whether retrying the same load can ever succeed.
Status codes follow vLLM 0.32 (measured in ``tests/conformance``): load 200 / 400 (bad input
or already loaded) / 404 (path missing) / 500 (the worker refused the adapter: rank above
``--max-lora-rank``, DoRA, corrupt tensors, ... — or an engine fault); unload 200 / 404.

A 500 is not "try again later" by itself: vLLM 0.32 wraps every refusal of its worker's
``add_lora`` in a 500 ``InternalServerError``, so ``load_failure_is_permanent`` reads the
message to tell a refused adapter (permanent until the desired entry changes) from an engine
that is restarting or broken (transient: back off and retry).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

_NO_RUNTIME_API = (
    "the engine has no runtime LoRA API (/v1/load_lora_adapter answered 404); "
    "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true and --enable-lora"
)


# Words of vLLM's worker when it refuses an adapter for what it is (vLLM 0.32 peft_helper,
# safetensors, LoRA model loading); retrying the same files cannot help.
_ADAPTER_REFUSALS = (
    "is greater than max_lora_rank",
    "does not yet support dora",
    "adapter bias is not supported",
    "modules_to_save",
    "deserializing header",
    "safetensors",
    "doesn't contain tensors",
    "expected target modules",
    "please verify that the loaded lora module is correct",
    "is not lora",
)


def load_failure_is_permanent(status: int | None, detail: str) -> bool:
    """Whether a failed ``/v1/load_lora_adapter`` stays failed until the adapter or the pool changes. Pure.

    No answer (None), 5xx other than a refused adapter (engine starting, dying, overloaded)
    and 429 are transient. Other 4xx (bad request, path missing, no runtime API) are permanent;
    a 500 whose message carries the worker's refusal of the adapter is permanent too.
    """
    if status is None or status == 429:
        return False
    if 400 <= status < 500:
        return True
    if status == 500:
        text = detail.lower()
        return any(words in text for words in _ADAPTER_REFUSALS)
    return False


class EngineError(Exception):
    """A failed engine call; ``permanent`` says whether retrying the same call can succeed.

    Read it as ``SourceError.transient``: ``exc.transient`` is ``not exc.permanent``.
    """

    def __init__(self, message: str, *, status: int | None = None, permanent: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        # Default for calls other than load: 4xx permanent, no answer or 5xx transient.
        self.permanent = (
            permanent if permanent is not None else (status is not None and 400 <= status < 500 and status != 429)
        )

    @property
    def transient(self) -> bool:
        return not self.permanent


class EngineClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        timeout_s: float,
        load_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session
        # vLLM started with --api-key refuses every /v1 route without it (spec.security.apiKeySecretRef).
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._load_timeout = aiohttp.ClientTimeout(total=load_timeout_s)

    async def healthy(self) -> bool:
        try:
            async with self._session.get(f"{self.base_url}/health", timeout=self._timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def adapters(self) -> dict[str, str]:
        """Loaded adapters: name -> root (the lora_path it was loaded from)."""
        try:
            async with self._session.get(
                f"{self.base_url}/v1/models", headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    raise EngineError(f"GET /v1/models answered HTTP {resp.status}", status=resp.status)
                body: Any = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise EngineError(f"GET /v1/models failed: {type(exc).__name__}: {exc}") from exc
        cards = body.get("data", []) if isinstance(body, dict) else []
        return {
            str(card["id"]): str(card.get("root") or "")
            for card in cards
            if isinstance(card, dict) and card.get("parent") and card.get("id")
        }

    async def load(self, name: str, path: str, *, inplace: bool) -> None:
        payload = {"lora_name": name, "lora_path": path, "load_inplace": inplace}
        status, text = await self._post("/v1/load_lora_adapter", payload, self._load_timeout, name)
        if status == 200:
            return
        detail = _detail(text)
        if _route_missing(status, text):
            raise EngineError(_NO_RUNTIME_API, status=status)
        if status == 404:
            raise EngineError(
                f"adapter {name!r}: the engine cannot find {path} (HTTP 404: {detail}); "
                "mount the adapter volume at the same path in the engine and the sidecar",
                status=status,
            )
        if status == 400 and "already been loaded" in detail:
            raise EngineError(f"adapter {name!r}: already loaded", status=status)
        if load_failure_is_permanent(status, detail):
            raise EngineError(
                f"adapter {name!r}: the engine refused to load it (HTTP {status}: {detail}); "
                "fix the adapter or the pool's LoRA settings",
                status=status,
                permanent=True,
            )
        raise EngineError(
            f"adapter {name!r}: the engine failed to load it (HTTP {status}: {detail}); will retry",
            status=status,
            permanent=False,
        )

    async def unload(self, name: str) -> None:
        status, text = await self._post("/v1/unload_lora_adapter", {"lora_name": name}, self._timeout, name)
        if _route_missing(status, text):
            raise EngineError(_NO_RUNTIME_API, status=status)
        if status in (200, 404):  # vLLM's 404: already gone, which is what we wanted
            return
        raise EngineError(f"adapter {name!r}: unload failed (HTTP {status}: {_detail(text)})", status=status)

    async def _post(
        self, path: str, payload: dict[str, Any], limit: aiohttp.ClientTimeout, name: str
    ) -> tuple[int, str]:
        try:
            async with self._session.post(
                f"{self.base_url}{path}", json=payload, headers=self._headers, timeout=limit
            ) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(
                f"adapter {name!r}: POST {path} failed ({type(exc).__name__}: {exc}); is the engine up at {self.base_url}?"
            ) from exc


def _route_missing(status: int, text: str) -> bool:
    """A 404/405 from the web framework (no such route), not from vLLM's LoRA handler.

    vLLM registers the runtime LoRA routes only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true;
    without them FastAPI answers ``{"detail": "Not Found"}``, while vLLM's own 404 (a path
    it cannot find) is an OpenAI-style error object."""
    if status not in (404, 405):
        return False
    try:
        body = json.loads(text)
    except ValueError:
        return True
    return isinstance(body, dict) and "detail" in body and "error" not in body


def _detail(text: str) -> str:
    """vLLM answers errors as {"error": {"message"}} (newer) or {"message"} (older)."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if body.get("message"):
            return str(body["message"])[:300]
    return text.strip()[:300]
