"""The simulated engine's LoRA caches: GPU slots and the CPU cache, and what a load costs. Pure.

No clock, no I/O: a load returns a ``LoadEvent`` priced by ``TimingParams``; ``engine.Engine``
(the only caller) owns one ``LoraCache``, asks it to make each step's batch adapters resident
(``activate``) and to serve the runtime ``load_lora_adapter`` call (``load``), and charges the
seconds to its clock. ``AdapterRef`` and ``LoadEvent`` are re-exported by ``engine``, the
public face of the simulated engine.

What it reproduces from vLLM (``vllm/lora/``, the worker's ``LRUCacheWorkerLoRAManager``):

* GPU slots (``max_loras``) and a CPU cache (``max_cpu_loras``), both least-recently-used; a
  batch adapter missing from the slots is loaded inside the step, from the CPU cache or from
  disk, and the whole batch waits for it; an adapter leaving the CPU cache leaves its GPU slot;
* the first read of a path is slower than a re-read (``cold``: the page cache is empty);
* vLLM 0.32's sticky ``load_inplace`` (``AdapterRef.reread``, set by the shell from the release's
  row): such an adapter is read from disk again at every step whose batch holds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from lorapool.sim.timing import TimingParams


@dataclass(frozen=True, slots=True)
class AdapterRef:
    """A loaded adapter as the engine knows it: vLLM's lora_int_id plus what prices a load."""

    lora_id: int
    name: str
    rank: int
    path: str
    # vLLM 0.32 after a load_inplace: the cached request keeps the flag, and the worker's
    # add_adapter re-reads it from disk at every step whose batch holds it (0.34 resets the flag)
    reread: bool = False


@dataclass(frozen=True, slots=True)
class LoadEvent:
    """An adapter copied into a GPU slot: from the CPU cache, or from disk (cold = first read)."""

    adapter: str
    source: str  # "cpu" or "disk"
    cold: bool
    seconds: float


class LoraCache:
    """The GPU slots and the CPU cache of one replica, each least recently used first."""

    def __init__(self, max_loras: int, cpu_capacity: int, timing: TimingParams) -> None:
        self.max_loras = max_loras
        self.cpu_capacity = cpu_capacity
        self.timing = timing
        self._gpu: OrderedDict[int, AdapterRef] = OrderedDict()  # least recently used first
        self._cpu: OrderedDict[int, AdapterRef] = OrderedDict()
        self._seen_paths: set[str] = set()

    def gpu_adapters(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(ref.name for ref in self._gpu.values())

    def cpu_adapters(self) -> tuple[str, ...]:
        """Adapters in the CPU cache, least recently used first."""
        return tuple(ref.name for ref in self._cpu.values())

    def load(self, ref: AdapterRef, *, replace: bool, in_use: set[int]) -> LoadEvent:
        """vLLM's add_lora utility call: read from disk into the CPU cache and, when a slot is
        free or idle, a GPU slot. ``in_use``: adapter ids of running requests, never evicted.
        ``replace`` re-reads an adapter already cached under the same id (load_inplace)."""
        if replace:
            self._cpu.pop(ref.lora_id, None)
            self._gpu.pop(ref.lora_id, None)
        if ref.lora_id in self._cpu:
            self._cpu.move_to_end(ref.lora_id)
            event = LoadEvent(ref.name, "cpu", False, 0.0)
        else:
            cold = ref.path not in self._seen_paths
            seconds = self.timing.disk_load_s(ref.rank, cold=cold)
            self._seen_paths.add(ref.path)
            self._cpu_insert(ref, in_use)
            event = LoadEvent(ref.name, "disk", cold, seconds)
        if ref.lora_id not in self._gpu and self._gpu_has_room(in_use):
            self._gpu_insert(ref, in_use)
            event = LoadEvent(event.adapter, event.source, event.cold, event.seconds + self.timing.gpu_load_s(ref.rank))
        elif ref.lora_id in self._gpu:
            self._gpu.move_to_end(ref.lora_id)
        return event

    def activate(self, batch: dict[int, AdapterRef]) -> tuple[LoadEvent, ...]:
        """Make every batch adapter resident in a GPU slot; return the loads that stalled."""
        events: list[LoadEvent] = []
        gpu, cpu = self._gpu, self._cpu
        for lora_id, ref in batch.items():
            if ref.reread:
                gpu.pop(lora_id, None)
                cpu.pop(lora_id, None)
            if lora_id in gpu:
                gpu.move_to_end(lora_id)
                if lora_id in cpu:
                    cpu.move_to_end(lora_id)
                continue
            if lora_id in cpu:
                cpu.move_to_end(lora_id)
                events.append(LoadEvent(ref.name, "cpu", False, self.timing.gpu_load_s(ref.rank)))
            else:
                cold = ref.path not in self._seen_paths
                self._seen_paths.add(ref.path)
                seconds = self.timing.disk_load_s(ref.rank, cold=cold) + self.timing.gpu_load_s(ref.rank)
                self._cpu_insert(ref, batch)
                events.append(LoadEvent(ref.name, "disk", cold, seconds))
            self._gpu_insert(ref, batch)
        return tuple(events)

    def _gpu_has_room(self, protect: Iterable[int]) -> bool:
        if len(self._gpu) < self.max_loras:
            return True
        protected = set(protect)
        return any(lora_id not in protected for lora_id in self._gpu)

    def _gpu_insert(self, ref: AdapterRef, protect: dict[int, AdapterRef] | set[int]) -> None:
        gpu = self._gpu
        if len(gpu) >= self.max_loras:
            victim = next((lid for lid in gpu if lid not in protect), None)
            if victim is None:  # cannot happen: a batch never holds more than max_loras adapters
                raise AssertionError("every GPU slot holds an adapter of the running batch")
            del gpu[victim]
        gpu[ref.lora_id] = ref

    def _cpu_insert(self, ref: AdapterRef, protect: dict[int, AdapterRef] | set[int]) -> None:
        cpu = self._cpu
        while len(cpu) >= self.cpu_capacity:
            victim = next((lid for lid in cpu if lid not in protect), next(iter(cpu)))
            del cpu[victim]
            self._gpu.pop(victim, None)  # vLLM deactivates what leaves the CPU cache
        cpu[ref.lora_id] = ref
