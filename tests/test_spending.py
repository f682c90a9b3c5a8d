"""Group-sequential boundaries (``judging.spending``): the recursive integration against
published constants, the spending functions' promise by a seeded simulation of the
looks, and the levels the extension's looks get. No timing."""

from __future__ import annotations

import math
import random

import pytest

from pytest_specperf.judging.spending import (
    OBRIEN_FLEMING,
    POCOCK,
    boundary,
    crossing,
    equal_fractions,
    look_level,
    obrien_fleming_spending,
    pocock_spending,
    upper_tail,
    z_upper,
)

FOUR = equal_fractions(4)
#: A gate's share of a case over its looks in the default suite: 5% / (7 tests x 5 gates).
GATE_SHARE = 0.05 / 35

# -- the integration against published constants ----------------------------------------


def test_pococks_constant_for_4_looks():
    """Pocock (1977), Jennison & Turnbull Table 2.1: K = 4, two-sided 5%: C_P = 2.361. The
    integration puts the constant within 0.002 of it."""
    assert crossing([2.361] * 4, FOUR, sides=2) == pytest.approx(0.05, abs=2e-4)
    assert crossing([2.359] * 4, FOUR, sides=2) > 0.05 > crossing([2.363] * 4, FOUR, sides=2)
    # one look alone at 2.361 cuts 1.8%: the correlation of the looks is what Pocock buys
    assert 2 * upper_tail(2.361) == pytest.approx(0.0182, abs=1e-4)


def test_obrien_flemings_boundary_for_4_looks():
    """O'Brien & Fleming (1979), Jennison & Turnbull Table 2.3: K = 4, two-sided 5%:
    C_B = 2.024, i.e. 4.049, 2.863, 2.337, 2.024 in z."""
    z = [2.024 * math.sqrt(4 / k) for k in range(1, 5)]
    assert [round(x, 3) for x in z] == [4.048, 2.862, 2.337, 2.024]
    assert crossing(z, FOUR, sides=2) == pytest.approx(0.05, abs=2e-4)
    lower = [2.022 * math.sqrt(4 / k) for k in range(1, 5)]
    upper = [2.026 * math.sqrt(4 / k) for k in range(1, 5)]
    assert crossing(lower, FOUR, sides=2) > 0.05 > crossing(upper, FOUR, sides=2)


@pytest.mark.parametrize(
    ("looks", "expected"),
    [
        (4, (4.3326, 2.9631, 2.3590, 2.0141)),
        (5, (4.8769, 3.3569, 2.6803, 2.2898, 2.0310)),
    ],
)
def test_lan_demets_obrien_fleming_type_boundaries(looks, expected):
    """Lan-DeMets O'Brien-Fleming-type spending, equally spaced looks, two-sided 5% (each
    tail 2.5%), as the Lan-DeMets programs (ldbounds, gsDesign's sfLDOF) tabulate them."""
    b = boundary(0.05, equal_fractions(looks), OBRIEN_FLEMING, sides=2)
    assert b.z == pytest.approx(expected, abs=2e-4)
    # the one-sided boundary at 2.5% is the same to the table's precision
    one = boundary(0.025, equal_fractions(looks), OBRIEN_FLEMING)
    assert one.z == pytest.approx(expected, abs=2e-4)


def test_lan_demets_pocock_type_boundaries():
    """Pocock-type spending, 5 equally spaced looks, two-sided 5%: 2.438, 2.427, 2.410,
    2.397, ...; the first look is the spending function itself: 5% ln(1 + (e-1)/5)."""
    b = boundary(0.05, equal_fractions(5), POCOCK, sides=2)
    assert b.z[:4] == pytest.approx((2.438, 2.427, 2.410, 2.397), abs=1e-3)
    assert b.nominal[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 5))
    assert b.spent[-1] == pytest.approx(0.05)


@pytest.mark.parametrize("spending", [POCOCK, OBRIEN_FLEMING])
@pytest.mark.parametrize("alpha", [0.05, GATE_SHARE, GATE_SHARE / 6])
def test_a_boundary_spends_its_level_look_by_look(spending, alpha):
    """Recomputed forward, the crossing probability of the first k looks is the
    spending function at t_k, and all four looks spend alpha, down to the gate levels."""
    b = boundary(alpha, FOUR, spending)
    for k in range(1, 5):
        assert crossing(b.z[:k], FOUR[:k]) == pytest.approx(b.spent[k - 1], rel=1e-5)
    assert crossing(b.z, FOUR) == pytest.approx(alpha, rel=1e-5)


def test_the_spending_functions():
    for fn in (pocock_spending, obrien_fleming_spending):
        assert fn(0.01, 0.0) == 0.0 and fn(0.01, 1.0) == pytest.approx(0.01)
        assert fn(0.01, 0.25) < fn(0.01, 0.5) < fn(0.01, 0.75)
    assert pocock_spending(1.0, 0.25) == pytest.approx(0.3574, abs=1e-4)
    assert z_upper(upper_tail(4.5)) == pytest.approx(4.5)


# -- the promise, by simulation --------------------------------------------------------------


def _crossed(rng: random.Random, z: list[float], n: int) -> list[int]:
    """Of ``n`` simulated quiet cases, looked at after each of 4 equal rounds (a Brownian
    motion seen at t = k/4, Z_k = W(t_k) / sqrt(t_k)), how many crossed by look k."""
    first = [0] * 4
    for _ in range(n):
        w = 0.0
        for k in range(4):
            w += rng.gauss(0.0, 0.5)
            if w / math.sqrt((k + 1) / 4) >= z[k]:
                first[k] += 1
                break
    return [sum(first[: k + 1]) for k in range(4)]


def test_a_simulation_of_the_looks_crosses_at_the_spent_level_and_bonferroni_under_it():
    """20000 seeded quiet cases at a one-sided 5% over 4 looks: the Pocock-type and
    O'Brien-Fleming-type boundaries cross about 5% of them (within 3 standard errors,
    look by look at the spending function), Bonferroni's equal split (1.25% a look)
    clearly less: the looks' correlation it ignores."""
    n, alpha = 20000, 0.05
    se = math.sqrt(alpha * (1 - alpha) / n)
    for spending in (POCOCK, OBRIEN_FLEMING):
        b = boundary(alpha, FOUR, spending)
        by_look = _crossed(random.Random(28), list(b.z), n)
        for k in range(4):
            spent_se = math.sqrt(b.spent[k] * (1 - b.spent[k]) / n)
            assert abs(by_look[k] / n - b.spent[k]) < 3 * spent_se + 1e-9, (spending, k)
        assert abs(by_look[-1] / n - alpha) < 3 * se
    bonferroni = _crossed(random.Random(28), [z_upper(alpha / 4)] * 4, n)[-1] / n
    assert bonferroni < alpha - 5 * se
    # the integration says the same of Bonferroni's split
    assert crossing([z_upper(alpha / 4)] * 4, FOUR) == pytest.approx(bonferroni, abs=3 * se)


# -- the levels the extension's looks get -----------------------------------------------------


def test_pocock_type_gives_every_look_more_than_bonferroni_at_the_gate_level():
    """At a gate's share in the default suite (1.4e-3 over 4 looks), every Pocock-type
    look's level exceeds Bonferroni's share (alpha / 4); O'Brien-Fleming-type leaves the
    first two looks next to nothing (why the plugin spends Pocock-type)."""
    pocock = [look_level(GATE_SHARE, k, 4) for k in range(1, 5)]
    assert all(p > GATE_SHARE / 4 for p in pocock)
    assert pocock[0] == pytest.approx(pocock_spending(GATE_SHARE, 0.25))
    assert pocock == sorted(pocock, reverse=True)
    obf = [look_level(GATE_SHARE, k, 4, OBRIEN_FLEMING) for k in range(1, 5)]
    assert obf[0] < 1e-9 and obf[1] < GATE_SHARE / 100 and obf[3] > GATE_SHARE / 4
    assert look_level(0.01, 1, 1) == 0.01  # one look: the level itself


def test_fewer_looks_or_more_correlated_ones_spend_less():
    """The judge reads the 4-look boundary by the run's rounds. A run whose first look
    already had 2 rounds (an A/B side with fewer processes) looks at rounds 2, 3, 4 only;
    a run stopped early looks fewer times; and the looks' real information grows more
    slowly than the rounds (the process and sitting noise do not shrink with rounds), so
    they correlate more than the plan assumes: every case spends at most alpha."""
    b = boundary(GATE_SHARE, FOUR)
    assert crossing(b.z[1:], FOUR[1:]) < GATE_SHARE
    assert crossing(b.z[:2], FOUR[:2]) < GATE_SHARE
    # information 1 / (floor + w^2 / k) with the floor as large as one round's w^2
    info = [1 / (1 + 1 / k) for k in range(1, 5)]
    real = tuple(i / info[-1] for i in info)
    assert crossing(b.z, real) < GATE_SHARE


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="alpha must be in"):
        boundary(1.5, FOUR)
    with pytest.raises(ValueError, match=r"fractions must rise"):
        boundary(0.05, (0.5, 0.25, 1.0))
    with pytest.raises(ValueError, match="spending must be one of"):
        boundary(0.05, FOUR, "haybittle")
    with pytest.raises(ValueError, match="look must be from 1 to 4, got 5"):
        look_level(0.05, 5, 4)
