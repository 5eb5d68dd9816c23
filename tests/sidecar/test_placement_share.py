"""The sidecar loads exactly its replica's share (docs/placement.md): real sidecars and simulators on loopback.

The slot arrives as the kubelet writes a downward-API file (here: a file the test writes), the
share as the adapters ConfigMap lists each adapter's slots.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sidecar_procs import NOT_YET, ConfigMapDir, Sidecar, adapter_set, engine_adapters, start_sidecar, start_sim

from lorapool.api.adapterset import AdapterSet
from lorapool.plan.placement import place, shares
from lorapool.sidecar.config import parse_slot
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.wait import wait_until

NAMES = [f"team-{i}" for i in range(8)]


@pytest.fixture
def catalog(tmp_path: Path) -> dict[str, str]:
    """Eight adapters on disk: name -> file:// source."""
    return {n: f"file://{write_peft_adapter(tmp_path / 'src' / n, seed=i)}" for i, n in enumerate(NAMES)}


def placed_set(catalog: dict[str, str], holders: dict[str, tuple[str, ...]] | None, everywhere: set[str]) -> str:
    entries = []
    for name, source in catalog.items():
        entry: dict[str, object] = {"name": name, "source": source}
        if holders is not None and name not in everywhere:
            entry["replicas"] = sorted(int(r) for r in holders[name])
        entries.append(entry)
    return adapter_set(entries)


class Replica:
    def __init__(self, sidecar: Sidecar, engine_port: int, slot_file: Path) -> None:
        self.sidecar, self.engine_port, self.slot_file = sidecar, engine_port, slot_file

    def holds(self) -> set[str]:
        return set(engine_adapters(self.engine_port))

    def wait_holds(self, want: set[str], what: str) -> None:
        wait_until(what, lambda: self.holds() == want or None, 20.0, retry_on=NOT_YET)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ConfigMapDir, list[Replica]]]:
    config = ConfigMapDir(tmp_path / "cm")
    config.write(adapter_set([]))
    with ExitStack() as stack:
        out = []
        for slot in range(2):
            port = free_port()
            stack.enter_context(start_sim(port))
            slot_file = tmp_path / f"podinfo-{slot}" / "slot"
            slot_file.parent.mkdir()
            slot_file.write_text(str(slot))
            sidecar = start_sidecar(config.path, port, tmp_path / f"adapters-{slot}", "--slot-file", str(slot_file))
            stack.enter_context(sidecar.proc)
            out.append(Replica(sidecar, port, slot_file))
        yield config, out


@pytest.mark.parametrize(
    ("text", "slot"),
    [("3", 3), ("0\n", 0), ("", None), (None, None), ("-1", None), ("three", None)],
    ids=["3", "0-newline", "empty-not-assigned-yet", "missing", "negative", "a-word"],
)
def test_parse_slot(text: str | None, slot: int | None) -> None:
    assert parse_slot(text) == slot


def test_share_keeps_adapters_placed_everywhere_and_on_the_slot() -> None:
    doc = json.loads(adapter_set([
        {"name": "pinned", "source": "file:///a/pinned"},
        {"name": "on-0", "source": "file:///a/x", "replicas": [0, 2]},
        {"name": "on-1", "source": "file:///a/y", "replicas": [1]},
        {"name": "nowhere", "source": "file:///a/z", "replicas": []},
    ]))  # fmt: skip
    pool = AdapterSet.model_validate(doc)
    assert [a.name for a in pool.share(0).adapters] == ["pinned", "on-0"]
    assert [a.name for a in pool.share(1).adapters] == ["pinned", "on-1"]
    assert [a.name for a in pool.share(None).adapters] == ["pinned"]  # no slot yet: only what is everywhere


def test_each_sidecar_loads_exactly_its_share_and_follows_a_new_placement(
    catalog: dict[str, str], replicas: tuple[ConfigMapDir, list[Replica]]
) -> None:
    config, (r0, r1) = replicas
    ids = ["0", "1"]
    holders = place(dict.fromkeys(NAMES, 1), ids, capacity=8)
    config.write(placed_set(catalog, holders, everywhere={"team-0"}))
    share = shares(holders, ids)
    for replica, slot in ((r0, "0"), (r1, "1")):
        replica.wait_holds(set(share[slot]) | {"team-0"}, f"slot {slot} holds its share plus the pinned adapter")
    assert r0.holds() & r1.holds() == {"team-0"}  # k=1: nothing but the pinned adapter is on both

    # k=2 for team-5: it joins the replica that lacked it, nothing else moves.
    holders2 = place({**dict.fromkeys(NAMES, 1), "team-5": 2}, ids, capacity=8)
    config.write(placed_set(catalog, holders2, everywhere={"team-0"}))
    share2 = shares(holders2, ids)
    for replica, slot in ((r0, "0"), (r1, "1")):
        replica.wait_holds(set(share2[slot]) | {"team-0"}, f"slot {slot} follows k=2 for team-5")
    assert "team-5" in r0.holds() & r1.holds()


def test_a_sidecar_without_a_slot_holds_only_what_is_everywhere_until_its_slot_arrives(
    catalog: dict[str, str], replicas: tuple[ConfigMapDir, list[Replica]]
) -> None:
    config, (r0, _) = replicas
    r0.slot_file.write_text("")  # the operator has not annotated the pod yet
    holders = place(dict.fromkeys(NAMES, 1), ["0", "1"], capacity=8)
    config.write(placed_set(catalog, holders, everywhere={"team-0"}))
    r0.wait_holds({"team-0"}, "no slot: only the pinned adapter")
    r0.slot_file.write_text("0")
    r0.wait_holds(set(shares(holders)["0"]) | {"team-0"}, "slot 0 arrived: its share loads")


def explicit_set(catalog: dict[str, str], slots: dict[str, list[int]]) -> str:
    return adapter_set([{"name": n, "source": catalog[n], "replicas": slots.get(n, [])} for n in catalog])


def test_an_adapter_moved_to_another_replica_stays_served_here_while_the_new_holder_loads_it(
    catalog: dict[str, str], replicas: tuple[ConfigMapDir, list[Replica]]
) -> None:
    config, (r0, r1) = replicas
    config.write(explicit_set(catalog, {"team-1": [0], "team-2": [1]}))
    r0.wait_holds({"team-1"}, "team-1 on slot 0")
    config.write(explicit_set(catalog, {"team-1": [1], "team-2": [1]}))  # placement moves team-1 to slot 1
    r1.wait_holds({"team-1", "team-2"}, "the new holder loaded team-1")
    assert "team-1" in r0.holds()  # drained (30 s by default), never a gap where no replica serves it
    assert {a["name"]: a["phase"] for a in r0.sidecar.status()["adapters"]}["team-1"] == "Loaded"


def test_a_drained_adapter_is_unloaded_once_its_drain_is_over(tmp_path: Path, catalog: dict[str, str]) -> None:
    config = ConfigMapDir(tmp_path / "cm1")
    slot_file = tmp_path / "slot"
    slot_file.write_text("0")
    port = free_port()
    with start_sim(port):
        sidecar = start_sidecar(
            config.path, port, tmp_path / "adapters", "--slot-file", str(slot_file), "--drain-seconds", "1"
        )
        with sidecar.proc:
            config.write(explicit_set(catalog, {"team-1": [0], "team-3": [0]}))
            wait_until("both on slot 0", lambda: set(engine_adapters(port)) == {"team-1", "team-3"} or None, 20.0,
                       retry_on=NOT_YET)  # fmt: skip
            config.write(explicit_set(catalog, {"team-1": [1], "team-3": [0]}))
            wait_until("team-1 unloaded after its 1 s drain", lambda: set(engine_adapters(port)) == {"team-3"} or None,
                       20.0, retry_on=NOT_YET)  # fmt: skip
