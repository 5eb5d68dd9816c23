"""What both resources are built from: the API group, the wire base classes and field helpers. Pure.

``api.adapter`` (LoRAAdapter) and ``api.pool`` with its spec sections (``api.sizing``,
``api.routing``, ``api.placement``) build their models from these: ``Spec`` / ``Wire``
(camelCase on the wire, unknown fields refused), ``ObjectMeta``, ``cel()`` for CEL rules,
the int-or-'auto' field schema, and ``validate_reporting_all`` for checks across fields
reported beside the fields' own problems. ``api.models`` re-exports the public names.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler
from pydantic_core import InitErrorDetails, PydanticCustomError

from lorapool.api.common import dns_label

GROUP = "lorapool.io"
VERSION = "v1alpha1"
API_VERSION: Final = "lorapool.io/v1alpha1"  # GROUP/VERSION, spelled out so its type is the Literal below
AUTO: Final = "auto"

ADAPTER_NAME = dns_label("sql-coder")
POOL_NAME = dns_label("llama3-8b")


def cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """Attach CEL ``x-kubernetes-validations`` (rule, message) to a model or field schema."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class Spec(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=None)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class Wire(Spec):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=_camel)


class Document(BaseModel):
    """Base of the documents the operator writes for its pods to re-read (the traffic policy, the
    router policy): camelCase on the wire, unknown fields refused, frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, alias_generator=_camel)


IntOrAuto = int | Literal["auto"]


# Rules of the int-or-'auto' fields, on the fields themselves so the API server names them.
AUTO_OR_POSITIVE = "type(self) == string ? self == 'auto' : self >= 1"


def int_or_auto_schema(name: str, rule: str, message: str) -> dict[str, Any]:
    return {"x-kubernetes-int-or-string": True, **cel((rule, f"{name} {message}"))}


def custom_error(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{message}", {"message": message})


def validate_reporting_all(
    handler: ValidatorFunctionWrapHandler, value: Any, problems: list[InitErrorDetails], title: str
) -> Any:
    """``handler(value)``, raising its errors and ``problems`` (checks across fields, made on the raw
    input) together: pydantic would otherwise skip a cross-field check when any field is wrong."""
    try:
        result = handler(value)
    except ValidationError as exc:
        if not problems:
            raise
        kept: list[InitErrorDetails] = [
            {"type": custom_error(e["type"], e["msg"]), "loc": e["loc"], "input": e["input"]}
            for e in exc.errors(include_url=False)
        ]
        raise ValidationError.from_exception_data(exc.title, [*kept, *problems]) from None
    if problems:
        raise ValidationError.from_exception_data(title, problems)
    return result


class ObjectMeta(Spec):
    """The part of metadata lorapool reads."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: Annotated[str, POOL_NAME] = Field(max_length=40)
    namespace: Annotated[str, dns_label("ml")] = Field(default="default", max_length=63)
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
