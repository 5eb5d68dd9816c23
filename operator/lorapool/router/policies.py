"""The named policies the router ships (``--policy``). Pure.

affinity      group requests by adapter on replicas where it is active, bounded load,
              never more distinct adapters in flight than a replica's LoRA slots
              (requests that fit nowhere wait in the router and bind late)
least-loaded  fewest requests in flight, adapter-blind (baseline)
round-robin   in turn, adapter-blind (baseline)

Each comes as a ``Scheduling``: the strict policy, and the best-effort policy used once a
held request has waited ``max_wait`` (or when holding is off).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from lorapool.router.filters import bounded_load, healthy, lora_slots, serves_model
from lorapool.router.pickers import HighestScore, RoundRobin
from lorapool.router.policy import Policy
from lorapool.router.scorers import kv_cache, least_load, lora_affinity, rendezvous, slot_pressure


class PolicyName(StrEnum):
    """Values of ``lorapool router --policy``."""

    AFFINITY = "affinity"
    LEAST_LOADED = "least-loaded"
    ROUND_ROBIN = "round-robin"


@dataclass(frozen=True)
class Scheduling:
    """A strict policy plus the fallback used when a request may not (or no longer) wait."""

    strict: Policy
    fallback: Policy
    # True when the strict policy may return None for a live pool (the request then waits).
    holds: bool


# Affinity levels are 0.2 apart; x10 that gap (2.0) outweighs every other scorer together
# (1.8), so affinity decides and the rest only break ties within a level: load first, then
# KV pressure, then the hash that sends a cold adapter home. Spreading a hot adapter is the
# bounded-load filter's job, not a score trade-off.
AFFINITY_WEIGHTS = {"lora_affinity": 10.0, "least_load": 1.0, "kv_cache": 0.5, "rendezvous": 0.3}


def affinity(load_factor: float = 1.25, load_slack: float = 2.0) -> Scheduling:
    """Adapter affinity with bounded load and LoRA-slot grouping."""
    scorers = (
        (lora_affinity, AFFINITY_WEIGHTS["lora_affinity"]),
        (least_load, AFFINITY_WEIGHTS["least_load"]),
        (rendezvous, AFFINITY_WEIGHTS["rendezvous"]),
        (kv_cache, AFFINITY_WEIGHTS["kv_cache"]),
    )
    cap = bounded_load(load_factor, load_slack)
    # The cap comes before the slot filter so that it is measured against the whole pool: a
    # hot adapter's replica over the cap is not a candidate even when every other replica's
    # slots are taken, so its requests wait and bind where a slot frees (they spread) instead
    # of piling up behind one replica's batch.
    strict = Policy("affinity", (healthy, serves_model, cap, lora_slots), scorers, HighestScore())
    # Best effort: same preferences, but among replicas that are all full, the least
    # over-committed one wins before load decides (slot_pressure outweighs least_load).
    fallback = Policy(
        "affinity-best-effort",
        (healthy, serves_model, cap),
        (*scorers, (slot_pressure, 2.0)),
        HighestScore(),
    )
    return Scheduling(strict, fallback, holds=True)


def least_loaded() -> Scheduling:
    """Fewest requests in flight (router's count plus foreign), ties in turn."""
    policy = Policy("least-loaded", (healthy, serves_model), ((least_load, 1.0),), HighestScore())
    return Scheduling(policy, policy, holds=False)


def round_robin() -> Scheduling:
    """Each backend that serves the model in turn."""
    policy = Policy("round-robin", (healthy, serves_model), (), RoundRobin())
    return Scheduling(policy, policy, holds=False)


def build(name: str | PolicyName, *, load_factor: float = 1.25, load_slack: float = 2.0) -> Scheduling:
    """The scheduling for a ``--policy`` value; raises ValueError naming the choices."""
    try:
        which = PolicyName(name)
    except ValueError:
        choices = ", ".join(p.value for p in PolicyName)
        raise ValueError(f"--policy={name!r} is not one of {choices}") from None
    if which is PolicyName.AFFINITY:
        return affinity(load_factor, load_slack)
    if which is PolicyName.LEAST_LOADED:
        return least_loaded()
    return round_robin()
