"""Each engine's vLLM version: read from GET /version, carried in the sidecar's report, shown in the
pool's status (``status.engineVersions``, the ``vLLM`` column of ``kubectl get lorapool``)."""

from __future__ import annotations

import pytest

from lorapool.api.crd import lorapool_crd
from lorapool.api.pods import EnginePod
from lorapool.api.report import ReplicaReport, decode, encode
from lorapool.api.vllm_versions import version_of
from lorapool.controller.decide import engine_versions
from lorapool.controller.status import engine_versions as version_rows


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({"version": "0.32.0"}, "0.32.0"),
        ({"version": "0.32.0+lorapool.sim.0.1.0"}, "0.32.0+lorapool.sim.0.1.0"),
        ({"version": " 0.34.0 "}, "0.34.0"),
        ({"version": ""}, None),
        ({"version": 34}, None),
        ({"version": "0.34.0\n<script>"}, None),  # not printable: not a version
        ({"version": "9" * 65}, None),  # too long for the report
        ({"detail": "Not Found"}, None),  # another server
        (["0.32.0"], None),
        (None, None),
    ],
)
def test_a_version_answer_is_read_or_unknown(body: object, want: str | None) -> None:
    assert version_of(body) == want


def test_the_report_carries_the_version_and_drops_junk() -> None:
    report = ReplicaReport(True, engine_version="0.34.0")
    assert decode(encode(report)) == report
    assert '"ver":"0.34.0"' in encode(report)
    assert "ver" not in encode(ReplicaReport(True))  # not read: absent, old readers unaffected
    assert decode('{"v":1,"engine":"Healthy","adapters":{},"ver":["x"]}') == ReplicaReport(True)


def engine(name: str, version: str | None, *, ready: bool = True, terminating: bool = False) -> EnginePod:
    return EnginePod(name, ready=ready, terminating=terminating, report=ReplicaReport(True, engine_version=version))


def test_status_counts_the_ready_engines_by_release_mid_rollout() -> None:
    pods = [
        engine("e-0", "0.32.0"),
        engine("e-1", "0.34.0"),
        engine("e-2", "0.34.0"),
        engine("e-3", "0.35.1"),  # an image lorapool does not support
        engine("e-4", None),  # its sidecar read no version
        engine("e-5", "0.34.0", ready=False),  # not serving: not counted
        engine("e-6", "0.32.0", terminating=True),
        EnginePod("e-7", ready=True),  # no report yet
    ]
    rows = [(r.version, r.replicas, r.supported) for r in version_rows(engine_versions(pods))]
    assert rows == [("0.34.0", 2, True), ("0.32.0", 1, True), ("0.35.1", 1, False), ("unknown", 1, False)]


def test_kubectl_get_shows_the_versions() -> None:
    columns = lorapool_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {"name": "vLLM", "type": "string", "jsonPath": ".status.engineVersions[*].version"}.items() <= next(
        c for c in columns if c["name"] == "vLLM"
    ).items()
