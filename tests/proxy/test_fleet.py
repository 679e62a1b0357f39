"""The fleet's picker (``proxy/fleet.py``), sans-io: bounded loads, stickiness, health, each policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec.proxy.fleet import SLOW_CHECKS, Fleet

URLS = [f"http://10.0.0.{k}:8000/v1" for k in range(1, 6)]
keys = st.text(min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 5),
    eps=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    ops=st.lists(st.tuples(keys, st.booleans(), st.integers(0, 50)), min_size=1, max_size=200),
    floor=st.integers(1, 10),
)
@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_no_server_goes_above_the_bound(
    n: int, eps: float, ops: list[tuple[str, bool, int]], floor: int
) -> None:
    """Whatever the arrivals and departures, a pick never takes its server above
    ceil((1 + eps) * average load), the new call counted (or the floor)."""
    fleet = Fleet(URLS[:n], epsilon=eps, min_load=floor)
    running = []
    for key, leave, which in ops:
        if leave and running:
            fleet.end(running.pop(which % len(running)))
            continue
        total = sum(s.inflight for s in fleet.servers) + 1
        s = fleet.pick(key)
        assert s is not None
        assert s.inflight + 1 <= max(math.ceil((1 + eps) * total / n), floor)
        fleet.begin(s)
        running.append(s)


@settings(max_examples=200, deadline=None)
@given(key=keys, n=st.integers(1, 5))
def test_a_session_sticks_to_its_home_while_loads_allow(key: str, n: int) -> None:
    """Same session, same server: across calls, fleets built anew, and the URLs' order."""
    a, b = Fleet(URLS[:n]), Fleet(list(reversed(URLS[:n])))
    home = a.home(key)
    for _ in range(5):
        s = a.pick(key)
        assert s is home
        a.begin(s)
        a.end(s)
    assert b.pick(key).url == home.url  # type: ignore[union-attr]


@settings(max_examples=200, deadline=None)
@given(sessions=st.lists(keys, min_size=1, max_size=40, unique=True), out=st.integers(0, 4))
def test_ejecting_a_server_moves_only_its_sessions(sessions: list[str], out: int) -> None:
    fleet = Fleet(URLS)
    before = {k: fleet.pick(k) for k in sessions}
    gone = fleet.servers[out]
    fleet.failed(gone, "ConnectionRefusedError")
    after = {k: fleet.pick(k) for k in sessions}
    for k in sessions:
        assert after[k] is not gone
        if before[k] is not gone:
            assert after[k] is before[k]
    fleet.checked(gone, True)  # re-admitted: every session back home
    assert {k: fleet.pick(k) for k in sessions} == before


def test_sessions_spread_over_the_ring() -> None:
    fleet = Fleet(URLS[:2])
    homes = [fleet.home(f"session-{k}").url for k in range(2000)]
    assert 0.4 < homes.count(URLS[0]) / len(homes) < 0.6


def test_a_busy_home_sends_the_session_to_the_next_server() -> None:
    fleet = Fleet(URLS[:2], epsilon=0.25, min_load=1)
    home = fleet.home("s")
    other = next(s for s in fleet.servers if s is not home)
    for _ in range(4):
        fleet.begin(home)
    assert fleet.pick("s") is other  # 5 > ceil(1.25 * 5 / 2) = 4
    for _ in range(3):
        fleet.end(home)
    assert fleet.pick("s") is home  # 2 <= ceil(1.25 * 2 / 2) = 2


def test_least_busy_round_robin_and_calls_without_a_session() -> None:
    fleet = Fleet(URLS[:3], route="least-busy")
    a, b, c = fleet.servers
    fleet.begin(a)
    fleet.begin(b)
    assert fleet.pick("any") is c
    session = Fleet(URLS[:3], min_load=1)
    session.begin(session.servers[0])
    assert session.pick(None) is not session.servers[0]  # no session: least busy
    rr = Fleet(URLS[:3], route="round-robin")
    assert len({id(rr.pick("same")) for _ in range(3)}) == 3


def test_health_ejects_readmits_and_falls_back_when_none_is_healthy() -> None:
    fleet = Fleet(URLS[:2])
    a, b = fleet.servers
    fleet.checked(a, False, "ConnectionRefusedError")
    assert not a.healthy and a.ejections == 1 and a.error == "ConnectionRefusedError"
    assert all(fleet.pick(f"k{i}") is b for i in range(50))
    fleet.failed(b, "refused")
    assert fleet.candidates() == [a, b]  # none healthy: every server is tried
    assert fleet.pick("k", exclude=[a, b]) is None
    fleet.checked(a, True)
    assert a.healthy and a.error is None and fleet.candidates() == [a]
    assert [f["healthy"] for f in fleet.figures()] == [True, False]


def test_a_fleet_needs_a_server() -> None:
    with pytest.raises(ValueError):
        Fleet([])


def test_a_busy_server_is_ejected_only_after_checks_time_out_in_a_row() -> None:
    fleet = Fleet(URLS[:2])
    a = fleet.servers[0]
    for _ in range(SLOW_CHECKS - 1):
        fleet.checked(a, False, "TimeoutError: ", slow=True)
        assert a.healthy and a.slow_checks > 0
    fleet.checked(a, True)
    assert a.slow_checks == 0
    for _ in range(SLOW_CHECKS):
        fleet.checked(a, False, "TimeoutError: ", slow=True)
    assert not a.healthy
    fleet.checked(a, True)
    fleet.checked(a, False, "ClientConnectorError: refused")  # a dead one: at once
    assert not a.healthy


def test_below_the_floor_a_busy_home_keeps_its_sessions() -> None:
    fleet = Fleet(URLS[:2])  # min_load 8
    home = fleet.home("s")
    for _ in range(4):
        fleet.begin(home)
    assert fleet.pick("s") is home  # 5 in flight <= 8, though the average is 2.5
    for _ in range(4):
        fleet.begin(home)
    assert fleet.pick("s") is not home  # 9 > max(ceil(1.5 * 9 / 2), 8)
