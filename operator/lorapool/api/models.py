"""The lorapool.io/v1alpha1 API: LoRAPool and LoRAAdapter as pydantic models. Pure.

One source of truth: the CRDs in ``crds/`` are generated from these models
(`lorapool crds`), so a field's description in them is what ``kubectl explain`` shows.
Rules the OpenAPI schema can carry live in ``Field`` constraints; rules across
fields are CEL expressions attached with ``cel()`` and enforced by validators too,
so `lorapool plan` refuses offline exactly what the API server refuses.

This module is the index: the models live in one module per resource (and per large spec
section) and are re-exported here, so callers import every API name from one place.

- ``api.fields``: the API group, the wire base classes, ``ObjectMeta`` and field helpers.
- ``api.adapter``: an adapter, inline (``AdapterSpec``) or as a LoRAAdapter resource.
- ``api.pool``: the LoRAPool resource, its spec's root and its smaller sections.
- ``api.sizing`` (spec.lora), ``api.routing`` (spec.router), ``api.placement`` (spec.placement).
"""

from __future__ import annotations

from lorapool.api.adapter import AdapterMeta as AdapterMeta
from lorapool.api.adapter import AdapterSpec as AdapterSpec
from lorapool.api.adapter import LoRAAdapter as LoRAAdapter
from lorapool.api.adapter import LoRAAdapterSpec as LoRAAdapterSpec
from lorapool.api.adapter import PoolRef as PoolRef
from lorapool.api.adapter import RankValue as RankValue
from lorapool.api.fields import ADAPTER_NAME as ADAPTER_NAME
from lorapool.api.fields import API_VERSION as API_VERSION
from lorapool.api.fields import AUTO as AUTO
from lorapool.api.fields import GROUP as GROUP
from lorapool.api.fields import POOL_NAME as POOL_NAME
from lorapool.api.fields import VERSION as VERSION
from lorapool.api.fields import IntOrAuto as IntOrAuto
from lorapool.api.fields import ObjectMeta as ObjectMeta
from lorapool.api.fields import Spec as Spec
from lorapool.api.fields import Wire as Wire
from lorapool.api.fields import cel as cel
from lorapool.api.fields import validate_reporting_all as validate_reporting_all
from lorapool.api.placement import ALL as ALL
from lorapool.api.placement import PlacementOverride as PlacementOverride
from lorapool.api.placement import PlacementSpec as PlacementSpec
from lorapool.api.pool import DEFAULT_LORAPOOL_IMAGE as DEFAULT_LORAPOOL_IMAGE
from lorapool.api.pool import DEFAULT_VLLM_IMAGE as DEFAULT_VLLM_IMAGE
from lorapool.api.pool import MANAGED_FLAGS as MANAGED_FLAGS
from lorapool.api.pool import BaseModelSpec as BaseModelSpec
from lorapool.api.pool import Credentials as Credentials
from lorapool.api.pool import EnvVar as EnvVar
from lorapool.api.pool import GpuProduct as GpuProduct
from lorapool.api.pool import GpuSpec as GpuSpec
from lorapool.api.pool import LoRAPool as LoRAPool
from lorapool.api.pool import LoRAPoolSpec as LoRAPoolSpec
from lorapool.api.pool import ModelArchitecture as ModelArchitecture
from lorapool.api.pool import S3Credentials as S3Credentials
from lorapool.api.pool import SecretKeyRef as SecretKeyRef
from lorapool.api.pool import SecuritySpec as SecuritySpec
from lorapool.api.pool import SidecarSpec as SidecarSpec
from lorapool.api.pool import Toleration as Toleration
from lorapool.api.pool import VllmSpec as VllmSpec
from lorapool.api.routing import DispatchSpec as DispatchSpec
from lorapool.api.routing import GatewaySpec as GatewaySpec
from lorapool.api.routing import RouterSpec as RouterSpec
from lorapool.api.sizing import LoraSpec as LoraSpec
from lorapool.api.sizing import SizingTuning as SizingTuning
