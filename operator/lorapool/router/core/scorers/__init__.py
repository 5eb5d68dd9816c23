"""Routing scorers: each rates candidate backends in [0, 1]. Pure, one per module."""

from lorapool.router.core.scorers.kv_cache import kv_cache
from lorapool.router.core.scorers.least_load import least_load
from lorapool.router.core.scorers.lora_affinity import lora_affinity
from lorapool.router.core.scorers.prefix import PrefixScorer
from lorapool.router.core.scorers.rendezvous import rendezvous
from lorapool.router.core.scorers.slot_pressure import slot_pressure

__all__ = ["PrefixScorer", "kv_cache", "least_load", "lora_affinity", "rendezvous", "slot_pressure"]
