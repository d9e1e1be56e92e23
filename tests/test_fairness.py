"""Who gets the next free resident slot (spark_backend.fairness): pure bookkeeping, no Spark."""

from __future__ import annotations

import pytest

from spark_backend.fairness import ACTIVE_WINDOW, QUANTUM, SPLIT_SECONDS, FairShares


def test_a_tenant_alone_may_hold_every_slot():
    shares = FairShares()
    first = shares.wait("a", 0.0)
    assert shares.next_ticket(2, 0.0) is first
    shares.grant(first, 0.0)
    second = shares.wait("a", 0.0)
    assert shares.next_ticket(2, 0.0) is second  # its share is both slots


def test_two_active_tenants_hold_one_slot_each_on_two_slots():
    shares = FairShares()
    shares.grant(shares.wait("slow", 0.0), 0.0)
    shares.wait("fast", 0.0)  # the fast tenant is active now
    again = shares.wait("slow", 0.1)
    fast = shares.next_ticket(2, 0.1)
    assert fast is not None and fast.tenant == "fast"  # it holds fewer, and slow is at its share
    shares.grant(fast, 0.1)
    assert shares.next_ticket(2, 0.1) is None  # slow may not take a second slot
    shares.release("fast", 0.2)
    # Fast stays active for ACTIVE_WINDOW after its last use: its share stays reserved.
    assert shares.next_ticket(2, 0.2 + ACTIVE_WINDOW / 2) is None
    assert shares.next_ticket(2, 0.2 + ACTIVE_WINDOW) is again


def test_a_freed_slot_goes_to_the_tenant_holding_fewest_then_the_longest_waiting():
    shares = FairShares()
    for tenant in ("a", "b", "c"):
        shares.grant(shares.wait(tenant, 0.0), 0.0)
    a_again, c_again, b_again = shares.wait("a", 1.0), shares.wait("c", 1.1), shares.wait("b", 1.2)
    shares.release("c", 2.0)  # c holds none now
    assert shares.next_ticket(3, 2.0) is c_again
    shares.grant(c_again, 2.0)
    shares.release("b", 2.1)
    assert shares.next_ticket(3, 2.1) is b_again
    shares.grant(b_again, 2.1)
    shares.release("a", 2.2)
    assert shares.next_ticket(3, 2.2) is a_again


def test_a_waiter_that_cannot_be_served_does_not_block_the_others():
    shares = FairShares()
    picky, plain = shares.wait("a", 0.0), shares.wait("b", 0.1)
    picky.fresh_after = 5.0
    assert shares.next_ticket(2, 0.2, can_serve=lambda ticket: ticket.fresh_after is None) is plain
    shares.withdraw(picky)
    assert shares.next_ticket(2, 0.2) is plain


def test_a_slow_tenants_micro_batch_is_cut_into_quanta_only_while_others_are_active():
    shares = FairShares()
    shares.grant(shares.wait("slow", 0.0), 0.0)
    shares.release("slow", 0.0)
    shares.measured("slow", groups=10, seconds=10.0)  # a second a group
    assert shares.parts_for("slow", 10, 1, 0.0) == 1  # alone on one slot: nobody to make room for
    shares.wait("fast", 0.0)
    assert shares.parts_for("slow", 10, 1, 0.0) == 10
    shares.measured("quick", groups=100, seconds=100 * QUANTUM / 400)
    assert shares.parts_for("quick", 100, 1, 0.0) == 1  # a whole micro-batch fits in a quantum


def _alone(tenant: str, groups: int, seconds: float) -> FairShares:
    """Shares with one tenant, which has just computed ``groups`` groups in ``seconds``."""
    shares = FairShares()
    shares.grant(shares.wait(tenant, 0.0), 0.0)
    shares.release(tenant, 0.0)
    shares.measured(tenant, groups=groups, seconds=seconds)
    return shares


def test_a_micro_batch_worth_spreading_gets_a_part_per_slot_of_its_share():
    heavy = _alone("heavy", groups=20, seconds=20 * SPLIT_SECONDS)  # a group: SPLIT_SECONDS
    assert heavy.parts_for("heavy", 20, 4, 0.0) == 4  # alone: every slot
    assert heavy.parts_for("heavy", 3, 4, 0.0) == 3  # never more parts than groups
    assert heavy.parts_for("heavy", 1, 4, 0.0) == 1
    assert heavy.parts_for("unknown", 20, 4, 0.0) == 1  # nothing measured yet
    light = _alone("light", groups=20, seconds=20 * SPLIT_SECONDS / 40)  # 20 groups: half of it
    assert light.parts_for("light", 20, 4, 0.0) == 1  # cheaper to compute whole than to split
    assert light.parts_for("light", 80, 4, 0.0) == 4  # four times as many: worth it
    heavy.grant(heavy.wait("neighbour", 0.0), 0.0)  # two active tenants: a share of 2 slots each
    assert heavy.parts_for("heavy", 4, 4, 0.0) == 2
    assert heavy.parts_for("heavy", 40, 1, 0.0) == 4  # one slot: a part per quantum, as before


def test_tenants_idle_for_long_are_forgotten():
    shares = FairShares()
    ticket = shares.wait("gone", 0.0)
    shares.grant(ticket, 0.0)
    shares.release("gone", 0.0)
    assert shares.active(ACTIVE_WINDOW * 7) == 0
    assert shares.held("gone") == 0 and "gone" not in shares._tenants


def test_others_waiting_counts_only_the_other_tenants_waiters():
    shares = FairShares()
    shares.grant(shares.wait("a", 0.0), 0.0)
    mine = shares.wait("a", 0.0)
    assert not shares.others_waiting("a")  # its own waiter is no one else's
    other = shares.wait("b", 0.0)
    assert shares.others_waiting("a") and shares.others_waiting("b")
    shares.withdraw(mine)
    assert shares.others_waiting("a") and not shares.others_waiting("b")
    shares.withdraw(other)
    assert not shares.others_waiting("a")


def test_a_trickles_one_group_parts_do_not_make_a_burst_look_long():
    # What any part costs (send, answer, the UDF's call) is most of a one-group part's time.
    shares = _alone("moving_avg", groups=1, seconds=0.001)
    for _ in range(10):
        shares.measured("moving_avg", groups=1, seconds=0.001)
    # Only one size seen: a rate per group is all there is, and a first burst is spread.
    assert shares.parts_for("moving_avg", 100, 2, 0.0) == 2
    shares.measured("moving_avg", groups=100, seconds=0.003)
    for _ in range(20):  # the burst's measure holds through the trickle that follows it
        shares.measured("moving_avg", groups=1, seconds=0.001)
        assert shares.parts_for("moving_avg", 100, 2, 0.0) == 1
    cost = shares._tenants["moving_avg"].cost
    assert cost.expected(100) == pytest.approx(0.003, rel=0.05) and cost.expected(1) == pytest.approx(0.001, rel=0.05)


def test_parts_all_of_one_size_are_costed_by_their_rate_per_group():
    shares = _alone("heavy", groups=20, seconds=0.2)
    shares.measured("heavy", groups=21, seconds=0.21)  # sizes this close fit no line: noise
    cost = shares._tenants["heavy"].cost
    assert cost.expected(40) == pytest.approx(0.4, rel=0.01)
    assert FairShares().parts_for("nobody", 40, 2, 0.0) == 1
