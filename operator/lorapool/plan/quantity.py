"""Kubernetes resource quantities ("64Gi", "500M") as bytes. Pure."""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def parse_bytes(value: str | int | float, *, field: str) -> int:
    """Bytes in a quantity; ValueError naming ``field`` when it is not one."""
    if isinstance(value, int | float):
        return int(value)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"{field}={value!r} is not a Kubernetes quantity such as 64Gi")
    number, suffix = match.groups()
    return int(float(number) * _SUFFIX[suffix or ""])
