"""NetworkPolicy on the suite's real node: kube-network-policies (cluster/netpol.py) refuses what a
policy does not admit, admits what it does, and leaves no nftables table behind, even killed.

The netlink helpers and the enforcer's command line are checked as plain data first; the test
marked `node` runs the enforcer (root, containerd; skips with the reason locally, fails under CI).
The pool's own policies are tested on the e2e tier's running pool (tests/e2e/test_e2e.py).
"""

from __future__ import annotations

import json
import os
import signal
import struct
from pathlib import Path

import pytest

from lorapool_dev.cluster import netpol
from lorapool_dev.cluster.node import RealNode
from lorapool_dev.cluster.versions import binary
from lorapool_dev.testing.wait import wait_until
from tests.e2e import policy_probes
from tests.e2e.conftest import built_image

# -- pure ------------------------------------------------------------------------------------------


def _new_table_message(name: str, seq: int = 7) -> bytes:
    """What the kernel sends per table in a dump: NEWTABLE, nfgenmsg, a flags attribute, the name."""
    body = netpol._attr(2, struct.pack("!I", 0)) + netpol._attr(netpol.NFTA_TABLE_NAME, name.encode() + b"\0")
    return netpol._message((netpol.NFNL_SUBSYS_NFTABLES << 8) | netpol.NFT_MSG_NEWTABLE, 2, seq, 1, body)


def test_a_table_dump_is_parsed_into_names_whatever_their_padding() -> None:
    data = _new_table_message("kube-network-policies") + _new_table_message("abc", 8)
    data += netpol._message(netpol.NLMSG_DONE, 2, 9, 0)
    messages = list(netpol.parse_messages(data))
    assert [(t & 0xFF, seq) for t, seq, _ in messages] == [(0, 7), (0, 8), (netpol.NLMSG_DONE, 9)]
    assert [netpol.table_name(p) for _, _, p in messages[:2]] == ["kube-network-policies", "abc"]
    assert netpol.table_name(b"\0\0\0\0") is None  # a table message without a name attribute


def test_a_malformed_netlink_message_is_an_error_not_a_loop() -> None:
    with pytest.raises(netpol.NetpolError, match="length=4"):
        list(netpol.parse_messages(struct.pack("=IHHII", 4, 0, 0, 0, 0)))


def test_the_delete_is_one_acknowledged_batch_naming_the_inet_table() -> None:
    messages = list(netpol.parse_messages(netpol.delete_table_request("kube-network-policies", 1)))
    types = [t for t, _, _ in messages]
    assert types == [netpol.NFNL_MSG_BATCH_BEGIN, (10 << 8) | netpol.NFT_MSG_DELTABLE, netpol.NFNL_MSG_BATCH_END]
    assert [seq for _, seq, _ in messages] == [1, 2, 3]  # delete_table waits for the ack of seq 2
    begin, delete = messages[0][2], messages[1][2]
    assert begin[:4] == bytes([0, 0, 0, netpol.NFNL_SUBSYS_NFTABLES])  # res_id: the subsystem, big-endian
    assert delete[0] == netpol.NFPROTO_INET and netpol.table_name(delete) == "kube-network-policies"
    assert netpol.error_code(struct.pack("=i", -2)) == -2


def test_bound_queues_are_read_from_the_proc_table() -> None:
    text = "  100  123456     0 2   128     0     0        5  1\n  7 1 0 2 128 0 0 0 1\n\n"
    assert netpol.bound_queues(text) == {100, 7}
    assert netpol.bound_queues("") == set()


def test_the_enforcer_gets_an_in_cluster_address_a_private_mount_namespace_and_the_node_name() -> None:
    argv = netpol.enforcer_argv(Path("/bin/knp"), Path("/run-dir/netpol"), "https://127.0.0.1:6443", "node-a")
    assert argv[:3] == ["env", "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443"]
    assert argv[3:6] == ["unshare", "--mount", "--propagation=private"]
    assert argv[argv.index(netpol.MOUNT_SCRIPT) + 2 : argv.index(netpol.MOUNT_SCRIPT) + 4] == [
        "/run-dir/netpol",
        "/bin/knp",
    ]
    assert "--hostname-override=node-a" in argv and f"--nfqueue-id={netpol.QUEUE_ID}" in argv
    assert "--metrics-bind-address=127.0.0.1:9080" in argv  # not every address of the namespace
    assert "mount -t tmpfs" in netpol.MOUNT_SCRIPT and netpol.SECRETS_MOUNT in netpol.MOUNT_SCRIPT


@pytest.mark.parametrize("server", ["http://127.0.0.1:6443", "https://127.0.0.1", "127.0.0.1:6443"])
def test_an_api_server_url_without_https_host_and_port_is_refused_by_name(server: str) -> None:
    with pytest.raises(netpol.NetpolError, match="KUBERNETES_SERVICE_HOST/PORT"):
        netpol.enforcer_argv(Path("/bin/knp"), Path("/d"), server, "node-a")


def test_the_enforcer_may_read_what_its_informers_watch_and_nothing_more() -> None:
    account, role, binding = netpol.rbac_manifests()
    assert account["metadata"] == {"name": netpol.SERVICE_ACCOUNT, "namespace": netpol.NAMESPACE}
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert verbs == {"get", "list", "watch"} and resources == {"pods", "namespaces", "nodes", "networkpolicies"}
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]


def test_nft_queue_is_read_from_the_kernel_config_and_assumed_where_unpublished() -> None:
    assert netpol.nft_queue_in_config("CONFIG_NF_TABLES=y\nCONFIG_NFT_QUEUE=m\n") is True
    assert netpol.nft_queue_in_config("CONFIG_NF_TABLES=y\n# CONFIG_NFT_QUEUE is not set\n") is False
    assert netpol.nft_queue_in_config(None) is True  # no /proc/config.gz: the enforcer's own chain is tried


def test_the_diversion_queues_new_pod_connections_only_and_is_removed_in_reverse() -> None:
    rules = netpol.diversion_rules("10.250.16.0/24")
    assert rules[0] == ["-N", netpol.CHAIN] and rules[-1] == ["-A", "POSTROUTING", "-j", netpol.CHAIN]
    body = [" ".join(r) for r in rules[1:-1]]
    assert body[:2] == [  # passes first: the node's root sockets (kubelet probes), then known connections
        f"-A {netpol.CHAIN} -m owner --uid-owner 0 -j RETURN",
        f"-A {netpol.CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
    ]
    assert [r for r in body[2:] if "--queue-num 100" in r and "10.250.16.0/24" in r] == body[2:] and len(body) == 4
    assert [r[0] for r in netpol.REMOVE_DIVERSION] == ["-D", "-F", "-X"]


def test_the_token_directory_is_root_only(tmp_path: Path) -> None:
    netpol.write_secrets(tmp_path / "s", "tok", b"CA")
    assert (tmp_path / "s" / "token").read_text() == "tok" and (tmp_path / "s" / "ca.crt").read_bytes() == b"CA"
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "s").iterdir()} == {"0o600"}
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == "0o700"


# -- on the real node --------------------------------------------------------------------------------

NS = "netpol-node-test"
SERVER = policy_probes.ProbePod(NS, "server", {"app": "server"})
CLIENT = policy_probes.ProbePod(NS, "client", {"role": "client"})
OTHER = policy_probes.ProbePod(NS, "other", {"role": "other"})
OUTSIDER = policy_probes.ProbePod(
    "netpol-node-test-other", "client", {"role": "client"}
)  # right labels, other namespace

ONLY_CLIENTS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "only-clients", "namespace": NS},
    "spec": {
        "podSelector": {"matchLabels": SERVER.labels},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": CLIENT.labels}}], "ports": [{"port": 8000}]}],
    },
}


def _enforcer_pid(node: RealNode) -> int:
    exe = str(binary(netpol.NAME))
    for pid in node.netns.pids():
        try:
            if exe in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        except OSError:
            continue
    raise AssertionError("no kube-network-policies process in the node's namespace")


def _server_ip(node: RealNode) -> str:
    out = node.kubectl("get", "pod", SERVER.name, "-n", NS, "-o", "json").stdout
    ip: str = json.loads(out)["status"]["podIP"]
    return ip


@pytest.mark.node
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_enforcer_refuses_what_a_policy_does_not_admit_and_leaves_no_table(real_node: RealNode) -> None:
    """One policy (only role=client of its namespace reaches app=server:8000) under the enforcer;
    then the enforcer SIGKILLed (traffic to selected pods stops: it fails closed), its rules
    removed by the node's stop path, and the enforcer started again."""
    node = real_node
    node.enforce_network_policy()
    assert netpol.enforcing(node.netns)
    kubectl = node.kubectl
    pods = [SERVER, CLIENT, OTHER, OUTSIDER]
    server = SERVER.manifest(built_image("runtime"))
    server["spec"]["containers"][0]["command"] = ["python", "-m", "http.server", "8000"]
    server["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8000}, "periodSeconds": 1}
    try:
        policy_probes.start(kubectl, pods[1:], built_image("runtime"))
        kubectl("apply", "-f", "-", input_text=json.dumps(server))
        kubectl("apply", "-f", "-", input_text=json.dumps(ONLY_CLIENTS))
        kubectl("wait", "--for=condition=Ready", f"pod/{SERVER.name}", "-n", NS, "--timeout=90s", timeout_s=100)
        ip = _server_ip(node)
        assert policy_probes.connect(kubectl, CLIENT, ip, 8000) == "REACHED"
        assert policy_probes.connect(kubectl, OTHER, ip, 8000) == "TIMEOUT"
        assert policy_probes.connect(kubectl, OUTSIDER, ip, 8000) == "TIMEOUT"

        os.kill(_enforcer_pid(node), signal.SIGKILL)  # no cleanup: its rules stay, with no one to judge
        wait_until("its queue without a listener", lambda: netpol.QUEUE_ID not in netpol.queues_bound(node.netns), 20)
        assert policy_probes.connect(kubectl, CLIENT, ip, 8000) == "TIMEOUT"  # it fails closed
        node.stop_network_policy()  # what teardown does: its rules go, whoever wrote them
        assert netpol.TABLE not in netpol.inet_tables(node.netns) and not netpol.diverted(node.netns)
        assert policy_probes.connect(kubectl, OTHER, ip, 8000) == "REACHED"  # the refusal was the enforcer's

        node.enforce_network_policy()  # started again: enforcing again
        assert policy_probes.connect(kubectl, OTHER, ip, 8000) == "TIMEOUT"
        assert policy_probes.connect(kubectl, CLIENT, ip, 8000) == "REACHED"
    finally:
        node.enforce_network_policy()  # as the session had it (the e2e tier wants it on)
        policy_probes.delete(kubectl, pods)
        kubectl("delete", "namespace", NS, OUTSIDER.namespace, "--wait=false", check=False)
