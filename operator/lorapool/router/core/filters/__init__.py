"""Routing filters: each drops backends that must not take a request. Pure, one per module."""

from lorapool.router.core.filters.bounded_load import bounded_load
from lorapool.router.core.filters.healthy import healthy
from lorapool.router.core.filters.lora_slots import lora_slots
from lorapool.router.core.filters.serves_model import serves_model

__all__ = ["bounded_load", "healthy", "lora_slots", "serves_model"]
