"""Exception tree of lorapool.

    LoRAPoolError                 base of everything we raise on purpose
    ├── SpecError                 the user's resource is wrong; fix the spec (permanent)
    │   └── PlanError             the spec is valid but cannot be served (does not fit, bad rank)
    ├── AdapterError              one adapter is unusable (bad config, rank, DoRA, checksum)
    │   └── UnsafePathError       a name or archive member would escape its directory
    └── SourceError               a source could not be read; usually transient (retry)

Every message names the field or adapter it is about and what to do next.
"""

from __future__ import annotations

from collections.abc import Sequence


class LoRAPoolError(Exception):
    """Base of all lorapool errors."""


class SpecError(LoRAPoolError):
    """One or more problems in a user's resource, each naming a field and a fix."""

    def __init__(self, problems: Sequence[str] | str) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


class PlanError(SpecError):
    """The spec is well-formed but no vLLM configuration serves it on the chosen GPU."""


class AdapterError(LoRAPoolError):
    """An adapter that vLLM would refuse or that fails verification."""


class UnsafePathError(AdapterError):
    """A name or archive member that would write outside its directory."""


class SourceError(LoRAPoolError):
    """A source that could not be read (network, credentials, missing object)."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        self.transient = transient
        super().__init__(message)
