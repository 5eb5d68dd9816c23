"""Routing filters: each drops backends that must not take a request. Pure, one per module."""

from lorapool.router.filters.bounded_load import bounded_load
from lorapool.router.filters.healthy import healthy
from lorapool.router.filters.lora_slots import lora_slots
from lorapool.router.filters.serves_model import serves_model

__all__ = ["bounded_load", "healthy", "lora_slots", "serves_model"]
