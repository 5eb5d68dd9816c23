"""How the benchmark's reports print a number: one rule, so every table reads alike."""

from __future__ import annotations

import math
from typing import Any


def fmt(x: Any, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; "-" for a missing or NaN value, "inf" for an infinite one."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"
