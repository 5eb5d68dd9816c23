"""The local control plane's error, raised by every part that runs it (pure: no I/O).

    ClusterError        the control plane could not be built, started, reached or stopped
    └── NodeError       (node.py) the real node could not be prepared, started or removed

Raised by `runtime` (LocalCluster), `health` (a wait that timed out or a component that died)
and `node`; caught by the `lorapool cluster` CLI, which prints it and exits non-zero.
Importable from `lorapool_dev.cluster.runtime` as before the split.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The local control plane could not be built, started, reached or stopped."""
