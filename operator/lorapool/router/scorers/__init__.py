"""Routing scorers: each rates candidate backends in [0, 1]. Pure, one per module."""

from lorapool.router.scorers.kv_cache import kv_cache
from lorapool.router.scorers.least_load import least_load
from lorapool.router.scorers.lora_affinity import lora_affinity
from lorapool.router.scorers.rendezvous import rendezvous
from lorapool.router.scorers.slot_pressure import slot_pressure

__all__ = ["kv_cache", "least_load", "lora_affinity", "rendezvous", "slot_pressure"]
