"""How the engine pod reaches its base model and adapter sources, read from the scheme table
(``lorapool.api.schemes``): the credentials env of its vLLM and sidecar containers, one volume per
mounted source, and vLLM's model argument and load format. Pure.

Called by ``lorapool.render.engine`` (the pod template and ``vllm serve``'s arguments). This is
the renderer's only scheme knowledge: a scheme whose credentials come from a Secret needs its env
in ``CREDENTIALS_ENV``, a mounted one its volume in ``MOUNTS`` (``tests/api/test_schemes.py``
checks both against the table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lorapool.api import schemes
from lorapool.api.models import Credentials, LoRAPool
from lorapool.api.schemes import SCHEMES, CredentialsFrom, Delivery, ModelArg, Scheme, scheme_of
from lorapool.plan.adapters import PoolAdapter
from lorapool.render import names
from lorapool.render.common import Obj

BASE_MODEL_VOLUME = "base-model"
BASE_MODEL_MOUNT = f"{names.MODELS_MOUNT}/base"  # vLLM's only; the model argument is a path under it


# --- credentials -------------------------------------------------------------------------------


def _secret_env(name: str, secret: str, key: str) -> Obj:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _hugging_face_env(creds: Credentials, use: CredentialsFrom) -> list[Obj]:
    """spec.credentials.huggingFace: one key of a Secret, as HF_TOKEN."""
    ref = creds.hugging_face
    if not ref:
        return []
    return [_secret_env(env, ref.name, ref.key) for env in use.env]


def _s3_env(creds: Credentials, use: CredentialsFrom) -> list[Obj]:
    """spec.credentials.s3: the Secret's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY under their own
    names, then the endpoint and the region as plain values."""
    s3 = creds.s3
    if not s3:
        return []
    env = [_secret_env(key, s3.secret_name, key) for key in use.env] if s3.secret_name else []
    endpoint_env, region_env = use.settings_env
    if s3.endpoint:
        env.append({"name": endpoint_env, "value": s3.endpoint})
    if s3.region:
        env.append({"name": region_env, "value": s3.region})
    return env


# The key a kubernetes.io/dockerconfigjson Secret holds its document under (the imagePullSecrets kind).
DOCKER_CONFIG_KEY = ".dockerconfigjson"


def _oci_env(creds: Credentials, use: CredentialsFrom) -> list[Obj]:
    """spec.credentials.oci: the Secret's .dockerconfigjson as LORAPOOL_OCI_AUTH (read by the sidecar's
    oci:// source, never logged), then the plain-HTTP registries as one comma-separated value."""
    oci = creds.oci
    if not oci:
        return []
    env = [_secret_env(name, oci.secret_name, DOCKER_CONFIG_KEY) for name in use.env] if oci.secret_name else []
    (plain_env,) = use.settings_env
    if oci.plain_http:
        env.append({"name": plain_env, "value": ",".join(oci.plain_http)})
    return env


# The env of every scheme whose credentials come from a Secret (CredentialsKind.SECRET_KEY, SECRET).
CREDENTIALS_ENV: Mapping[Scheme, Callable[[Credentials, CredentialsFrom], list[Obj]]] = {
    schemes.HF: _hugging_face_env,
    schemes.S3: _s3_env,
    schemes.OCI: _oci_env,
}


def credentials_env(pool: LoRAPool) -> list[Obj]:
    """Every scheme's credentials the pool names, in the table's order: the vLLM and the sidecar
    containers both get them (either may read any scheme)."""
    creds = pool.spec.credentials
    if creds is None:
        return []
    return [env for s in SCHEMES if s in CREDENTIALS_ENV for env in CREDENTIALS_ENV[s](creds, s.credentials)]


# --- mounted sources ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceMount:
    """How the engine pod mounts the sources of a ``Delivery.MOUNTED`` scheme."""

    volume: Callable[[str], Obj]  # the volume source for a source's authority (a pvc:// claim)
    root: str  # where adapter sources' volumes are mounted, a directory per authority


def _claim_volume(claim: str) -> Obj:
    return {"persistentVolumeClaim": {"claimName": claim, "readOnly": True}}


MOUNTS: Mapping[Scheme, SourceMount] = {
    # The root is the sidecar's default --pvc-root (SourceOptions.pvc_root), where it copies pvc:// adapters from.
    schemes.PVC: SourceMount(_claim_volume, root="/mnt/pvc"),
}


def _mounted(source: str) -> Scheme | None:
    scheme = scheme_of(source)
    return scheme if scheme is not None and scheme.delivery is Delivery.MOUNTED else None


def base_model_volumes(pool: LoRAPool) -> list[Obj]:
    """``base-model``, the volume a mounted base model is read from; none for the other schemes."""
    source = pool.spec.base_model.source
    scheme = _mounted(source)
    if scheme is None:
        return []
    authority, _ = scheme.split(source)
    return [{"name": BASE_MODEL_VOLUME, **MOUNTS[scheme].volume(authority)}]


def base_model_mounts(pool: LoRAPool) -> list[Obj]:
    """vLLM's mount of the base model's volume, when it has one."""
    return [{"name": v["name"], "mountPath": BASE_MODEL_MOUNT, "readOnly": True} for v in base_model_volumes(pool)]


def adapter_source_volumes(adapters: Sequence[PoolAdapter]) -> list[tuple[Obj, Obj]]:
    """One volume per authority (claim) that mounted adapter sources name, in adapter order, named
    ``<scheme>-<authority>``, with its read-only mount at ``<root>/<authority>``."""
    found: dict[str, tuple[Obj, Obj]] = {}
    for adapter in adapters:
        source = adapter.spec.source
        scheme = _mounted(source)
        if scheme is None:
            continue
        authority, _ = scheme.split(source)
        name = f"{scheme.name}-{authority}"
        mount = MOUNTS[scheme]
        found.setdefault(
            name,
            (
                {"name": name, **mount.volume(authority)},
                {"name": name, "mountPath": f"{mount.root}/{authority}", "readOnly": True},
            ),
        )
    return list(found.values())


# --- the base model in vLLM's arguments ---------------------------------------------------------


def model_arg(pool: LoRAPool) -> str:
    """``vllm serve``'s model: a Hub id, a path on the pod's filesystem, or the source as written."""
    source = pool.spec.base_model.source
    scheme = scheme_of(source)
    use = scheme.base_model if scheme is not None else None
    if scheme is None or use is None:
        return source
    if use.model_arg is ModelArg.MOUNT_PATH:
        _, path = scheme.split(source)
        return f"{BASE_MODEL_MOUNT}/{path}".rstrip("/")
    if use.model_arg is ModelArg.AFTER_PREFIX:
        return scheme.after_prefix(source)
    return source  # ModelArg.URI: s3://, streamed by vLLM's runai_streamer load format


def load_format_args(pool: LoRAPool) -> list[str]:
    """``--load-format`` when the base model's scheme needs one (s3://: runai_streamer)."""
    scheme = scheme_of(pool.spec.base_model.source)
    use = scheme.base_model if scheme is not None else None
    return ["--load-format", use.load_format] if use is not None and use.load_format else []
