"""Kubernetes client credentials for every shell that talks to an API server (operator, router).

One precedence, as kubectl and controller-runtime have it, so a component never picks other
credentials than its neighbour: an explicit ``--kubeconfig``, then ``$KUBECONFIG``, then the
Pod's ServiceAccount (in cluster), then ``~/.kube/config``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import cast

from kubernetes import client, config

# The client ships py.typed but leaves its config loaders unannotated; typed here, at the edge.
load_kube_config = cast(Callable[..., None], config.load_kube_config)
load_incluster_config = cast(Callable[[], None], config.load_incluster_config)


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A configured ApiClient; raises kubernetes.config.ConfigException when no credentials exist.

    The credentials also become the client library's default Configuration: the operator hands
    that same default to kopf (its login handler), so both talk to the server as one identity.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        load_kube_config(config_file=path)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        load_incluster_config()
    else:
        load_kube_config()
    return client.ApiClient()
