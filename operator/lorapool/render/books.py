"""The routers' shared books (``spec.router.sharedState``, docs/high-availability.md): the router's
flags and credentials env, and the store the operator runs for a pool that asks for one. Pure.

Several routers of one pool decide as one only when they see each other's books (the requests each
bound and holds, the slot claims it is making, its demand on rate limits); ``lorapool router
--shared-state URL`` keeps them in a Redis-protocol store. The store is either the user's (``url``,
credentials from a Secret into env the router adds to the URL: never in args, status or logs) or
rendered here per pool (``rendered``): Deployment and Service ``<pool>-books``, a memory-only
redis-server bounded by ``--maxmemory`` with ``noeviction`` (a full store refuses writes, which the
routers count and route around; it never drops live books silently), behind a NetworkPolicy that
admits the pool's router pods alone.

Called by ``render.router`` (args, env) and ``render.manifests.render_pool`` (the store's objects);
the operator prunes the store's objects when the spec stops rendering them
(``controller.gateway.door_leftovers``).
"""

from __future__ import annotations

from lorapool import __version__
from lorapool.api.models import LoRAPool
from lorapool.api.routing import RenderedStore
from lorapool.render import names
from lorapool.render.common import Obj, RenderOptions, meta, restricted

COMPONENT = "books"
PORT = 6379
DATA_MOUNT = "/data"
IMAGE_NAME = "lorapool-books"
USERNAME_ENV = "LORAPOOL_SHARED_STATE_USERNAME"
PASSWORD_ENV = "LORAPOOL_SHARED_STATE_PASSWORD"
UID = 1000  # the lorapool user of the image's base (Dockerfile runtime-base), as the router runs
_MI = 2**20


def store_url(pool: LoRAPool) -> str | None:
    """The URL the routers reach the store at; None without ``sharedState``."""
    shared = pool.spec.router.shared_state
    if shared is None:
        return None
    if shared.url is not None:
        return shared.url
    return f"redis://{names.books_store(pool.metadata.name)}.{pool.metadata.namespace}.svc:{PORT}/0"


def store_key(pool: LoRAPool) -> str:
    """The pool's identity in the store's keys: its uid (one store may serve many pools, and a pool
    deleted and made again under its name must not read the old one's books); an offline render,
    which has no uid, says ``<namespace>/<name>``."""
    return pool.metadata.uid or f"{pool.metadata.namespace}/{pool.metadata.name}"


def router_args(pool: LoRAPool) -> list[str]:
    """``--shared-state URL --shared-state-key KEY``, for both doors (the picker is the router process)."""
    url = store_url(pool)
    return [] if url is None else ["--shared-state", url, "--shared-state-key", store_key(pool)]


def router_env(pool: LoRAPool) -> list[Obj]:
    """The store's ACL user (optional in the Secret) and password from ``credentialsSecret``: the
    router adds them to the URL, so they never reach the command line, a status or a log."""
    shared = pool.spec.router.shared_state
    secret = shared.credentials_secret if shared is not None else None
    if secret is None:
        return []
    return [
        {
            "name": USERNAME_ENV,
            "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.username_key, "optional": True}},
        },
        {"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.password_key}}},
    ]


def default_image(lorapool_image: str) -> str:
    """``<registry>/lorapool-books:<tag>`` beside the operator's image (the sim image's scheme):
    ghcr.io/lorapool/lorapool:0.1.0 -> ghcr.io/lorapool/lorapool-books:0.1.0. Without a tag (a
    digest), the tag is this lorapool's version."""
    ref = lorapool_image.split("@", 1)[0]
    where, _, last = ref.rpartition("/")
    _, colon, tag = last.partition(":")
    repository = f"{where}/{IMAGE_NAME}" if where else IMAGE_NAME
    return f"{repository}:{tag if colon and tag else __version__}"


def store_resources(store: RenderedStore) -> Obj:
    """``rendered.resources``, else memory for maxMemory plus half again (fragmentation, client
    buffers, the process) and 32Mi, requested as much as its limit so the store is not evicted first."""
    if store.resources is not None:
        return dict(store.resources)
    memory = f"{-(-(store.max_memory_bytes * 3 // 2 + 32 * _MI) // _MI)}Mi"
    return {"requests": {"cpu": "50m", "memory": memory}, "limits": {"memory": memory}}


def store_args(store: RenderedStore) -> list[str]:
    """redis-server's command line: memory only (no RDB, no AOF), bounded, refusing writes when full."""
    return [
        "--port",
        str(PORT),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        DATA_MOUNT,
        "--maxmemory",
        str(store.max_memory_bytes),
        # noeviction: a full store refuses writes (the routers count it and decide from their own
        # books); any eviction policy could drop a live claim or a held request silently.
        "--maxmemory-policy",
        "noeviction",
        # Reached through the Service by the router pods, which the NetworkPolicy alone admits.
        "--protected-mode",
        "no",
    ]


def store_deployment(pool: LoRAPool, store: RenderedStore, opts: RenderOptions) -> Obj:
    """Deployment ``<pool>-books``: one memory-only redis-server, non-root, read-only root, no token."""
    p = pool.metadata.name
    probe = {"tcpSocket": {"port": "redis"}}
    container: Obj = {
        "name": "redis",
        "image": store.image or default_image(opts.lorapool_image),
        "imagePullPolicy": opts.image_pull_policy,
        "command": ["redis-server"],  # also on a Redis or Valkey image whose entrypoint is a script
        "args": store_args(store),
        "ports": [{"name": "redis", "containerPort": PORT, "protocol": "TCP"}],
        "resources": store_resources(store),
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": restricted(read_only_root=True),
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
    }
    pod: Obj = {
        "automountServiceAccountToken": False,  # the store calls no API
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "16Mi"}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(pool, names.books_store(p), COMPONENT),
        "spec": {
            "replicas": 1,
            # Recreate: two stores side by side would split the routers between two sets of books.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": names.selector(p, COMPONENT)},
            "template": {"metadata": {"labels": names.labels(p, COMPONENT)}, "spec": pod},
        },
    }


def store_service(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(pool, names.books_store(p), COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(p, COMPONENT),
            "ports": [{"name": "redis", "port": PORT, "targetPort": "redis", "protocol": "TCP"}],
        },
    }


def store_network_policy(pool: LoRAPool) -> Obj:
    """NetworkPolicy ``<pool>-books``: only this pool's router pods (both doors run in them) reach the
    store's port. The store has no password: this policy is what keeps other pods from its books."""
    p = pool.metadata.name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(pool, names.books_store(p), COMPONENT),
        "spec": {
            "podSelector": {"matchLabels": names.selector(p, COMPONENT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": names.selector(p, "router")}}],
                    "ports": [{"port": PORT, "protocol": "TCP"}],
                }
            ],
        },
    }


def store_objects(pool: LoRAPool, opts: RenderOptions) -> list[Obj]:
    """The rendered store's objects in apply order (its policy before its pod); none for a ``url`` or
    without ``sharedState``. The policy is rendered whatever ``spec.security.networkPolicy`` says (that
    switch is about the engines): a store without a password must not be open to every pod."""
    shared = pool.spec.router.shared_state
    if shared is None or shared.rendered is None:
        return []
    return [store_network_policy(pool), store_service(pool), store_deployment(pool, shared.rendered, opts)]
