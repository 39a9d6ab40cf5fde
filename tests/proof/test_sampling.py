"""The sampling check's statistics (patcher/proof/sampling.py): the chi-square tail and the G-test.

Every check comes with a negative control: the same assertion made where it must not hold, so a
test that could never fail would show here.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest

from patcher.proof.sampling import ALPHA, Homogeneity, chi2_sf, homogeneity, indistinguishable

# ---------------------------------------------------------------------------------------------
# chi2_sf
# ---------------------------------------------------------------------------------------------

# Chi-square quantiles (mpmath, 40 digits, rounded to 16): the printed tables' 3.841459, 6.634897,
# 11.0705, 23.2093 and 67.5048 to full precision, so the tail can be held to 1e-9 and not to
# the table's rounding.
QUANTILES = [
    (3.841458820694126, 1, 0.05),
    (6.634896601021215, 1, 0.01),
    (11.07049769351635, 5, 0.05),
    (23.20925115895436, 10, 0.01),
    (67.5048065495412, 50, 0.05),
]

# Q(dof / 2, x / 2) from mpmath.gammainc(regularized=True) at 40 digits: large dof, deep tails, x
# near 0, where no closed form below reaches.
REFERENCE = [
    (500.0, 500, 0.49158937303100904),
    (560.0, 500, 0.03235481928208544),
    (1000.0, 500, 1.2085183611329767e-35),
    (400.0, 500, 0.99963792954171031),
    (1400.0, 3, 2.9456193610163087e-303),
    (0.001, 1, 0.97477287936996039),
    (0.5, 7, 0.99944648139042497),
    (150.5, 100, 0.00082431081015290405),
    (2000.0, 250, 3.8466099978506483e-270),
]

GRID = [0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0, 144.0, 233.0, 377.0, 610.0, 987.0]


def closed_form(x: float, dof: int) -> float:
    """Q(dof / 2, x / 2) by the finite sums that hold for whole and half-whole a (no series, no fraction)."""
    h = x / 2.0
    if dof % 2 == 0:  # Poisson tail: e^-h sum_{i < dof/2} h^i / i!
        return math.fsum(math.exp(i * math.log(h) - h - math.lgamma(i + 1)) for i in range(dof // 2))
    # erfc(sqrt h) + e^-h sum_{i=1}^{(dof-1)/2} h^(i-1/2) / Gamma(i + 1/2)
    terms = [math.erfc(math.sqrt(h))]
    terms += [math.exp((i - 0.5) * math.log(h) - h - math.lgamma(i + 0.5)) for i in range(1, (dof - 1) // 2 + 1)]
    return math.fsum(terms)


def decreasing(values: list[float]) -> bool:
    return all(later < earlier for earlier, later in zip(values, values[1:]))


@pytest.mark.parametrize(("x", "dof", "p"), QUANTILES)
def test_the_tail_at_the_tables_quantiles(x: float, dof: int, p: float) -> None:
    assert chi2_sf(x, dof) == pytest.approx(p, rel=1e-9)
    # The printed tables' rounded quantiles land within their rounding.
    assert chi2_sf(float(f"{x:.6g}"), dof) == pytest.approx(p, rel=2e-5)
    # The control: the same x with one degree of freedom more is another tail.
    assert chi2_sf(x, dof + 1) != pytest.approx(p, rel=1e-3)


@pytest.mark.parametrize(("x", "dof", "q"), REFERENCE)
def test_the_tail_against_high_precision_values(x: float, dof: int, q: float) -> None:
    assert chi2_sf(x, dof) == pytest.approx(q, rel=1e-10, abs=0.0)  # abs=0: the tails are far below 1e-12
    assert chi2_sf(x * 1.01, dof) != pytest.approx(q, rel=1e-6, abs=0.0)  # the control: 1 % off in x shows


def test_two_degrees_of_freedom_are_an_exponential() -> None:
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1.0), rel=1e-14)
    for x in [*GRID, 1400.0]:
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2.0), rel=1e-12, abs=0.0), x
    # The control: one degree of freedom is not (it is erfc(sqrt(x / 2))).
    assert chi2_sf(2.0, 1) == pytest.approx(math.erfc(1.0), rel=1e-12)
    assert chi2_sf(2.0, 1) != pytest.approx(math.exp(-1.0), rel=1e-3)


@pytest.mark.parametrize("dof", [1, 2, 3, 4, 5, 7, 10, 15, 30, 31, 60, 99, 100])
def test_the_tail_matches_the_closed_forms(dof: int) -> None:
    for x in GRID:
        assert chi2_sf(x, dof) == pytest.approx(closed_form(x, dof), rel=1e-10, abs=0.0), x
    # The control: the comparison tells neighbouring degrees of freedom apart.
    assert chi2_sf(float(dof), dof + 1) != pytest.approx(closed_form(float(dof), dof), rel=1e-3)


@pytest.mark.parametrize("dof", [1, 2, 9, 50, 149, 500])
def test_the_two_methods_meet_where_one_hands_over_to_the_other(dof: int) -> None:
    # The series serves x / 2 < dof / 2 + 1, the continued fraction beyond: x = dof + 2.
    x = dof + 2.0
    below, above = chi2_sf(x - 1e-9, dof), chi2_sf(x + 1e-9, dof)
    assert above < below
    assert above == pytest.approx(below, rel=1e-8)
    assert chi2_sf(x + 1e-3, dof) != pytest.approx(below, rel=1e-8)  # the control: a real step shows


def test_the_tail_falls_in_x_and_rises_in_dof() -> None:
    for dof in (1, 3, 40, 500):
        # Strictly where it is neither 1 nor 0 in floating point (at dof 500 and x = 1, P ~ 1e-900).
        around = [dof + f * math.sqrt(2 * dof) for f in (-2, -1, -0.5, 0, 0.5, 1, 2, 3)]  # mean dof, sd sqrt(2 dof)
        tail = [q for q in (chi2_sf(x, dof) for x in sorted({*GRID, *around})) if 0.0 < q < 1.0]
        assert len(tail) >= 5
        assert decreasing(tail)
        # The control: the distribution function rises, and the predicate sees it.
        assert not decreasing([1.0 - q for q in tail])
    for x in (0.5, 10.0, 100.0):
        rising = [q for q in (chi2_sf(x, dof) for dof in range(1, 200)) if q < 1.0]
        assert len(rising) >= 10
        assert decreasing(rising[::-1])
        assert not decreasing(rising)  # the control
    assert 0.0 <= chi2_sf(1e6, 1) < 1e-300  # underflows to nothing, never below 0
    assert chi2_sf(math.inf, 3) == 0.0


def test_no_statistic_is_all_of_the_distribution() -> None:
    for dof in (1, 2, 77):
        assert chi2_sf(0.0, dof) == 1.0
        assert chi2_sf(-3.0, dof) == 1.0
    for dof in (1, 2, 3):  # the control: a little above 0 leaves some mass below (where a double holds it)
        assert chi2_sf(1e-6, dof) < 1.0
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        chi2_sf(1.0, 0)
    with pytest.raises(ValueError, match="NaN"):
        chi2_sf(math.nan, 1)


# ---------------------------------------------------------------------------------------------
# homogeneity on tables worked by hand
# ---------------------------------------------------------------------------------------------


def test_a_two_by_two_table_by_hand() -> None:
    a, b = {7: 10, 8: 30}, {7: 40, 8: 40}
    # n_a = 40, n_b = 80, N = 120; column totals 50 and 70; E = row total x column total / N.
    e_a7, e_a8, e_b7, e_b8 = 40 * 50 / 120, 40 * 70 / 120, 80 * 50 / 120, 80 * 70 / 120
    assert (e_a7, e_b8) == pytest.approx((50 / 3, 140 / 3))
    g = 2 * (10 * math.log(10 / e_a7) + 30 * math.log(30 / e_a8) + 40 * math.log(40 / e_b7) + 40 * math.log(40 / e_b8))
    assert g == pytest.approx(
        2 * (10 * math.log(0.6) + 30 * math.log(9 / 7) + 40 * math.log(1.2) + 40 * math.log(6 / 7))
    )

    result = homogeneity(a, b)
    assert result.statistic == pytest.approx(g, rel=1e-12)
    assert g == pytest.approx(7.1160, abs=1e-4)
    assert (result.dof, result.samples, result.categories, result.pooled) == (1, (40, 80), 2, 0)
    assert result.p_value == pytest.approx(math.erfc(math.sqrt(g / 2)), rel=1e-10)  # chi-square, 1 dof
    assert not indistinguishable(result)  # p = 0.0076: a quarter against a half shows at 40 and 80 draws
    # The control: the same proportions at 12 and 24 draws do not (p = 0.14).
    small = homogeneity({7: 3, 8: 9}, {7: 12, 8: 12})
    assert indistinguishable(small)
    assert small.p_value > 0.05


def test_a_table_with_an_empty_cell_by_hand() -> None:
    a, b = {1: 30, 2: 0, 3: 30}, {1: 20, 2: 20, 3: 20}
    # n_a = n_b = 60, N = 120; columns 50, 20, 50, so E = 25, 10, 25 in both rows; O = 0 adds 0.
    g = 2 * (
        30 * math.log(30 / 25)
        + 0
        + 30 * math.log(30 / 25)
        + 20 * math.log(20 / 25)
        + 20 * math.log(20 / 10)
        + 20 * math.log(20 / 25)
    )
    result = homogeneity(a, b)
    assert result.statistic == pytest.approx(g, rel=1e-12)
    assert (result.dof, result.categories, result.pooled) == (2, 3, 0)
    assert result.p_value == pytest.approx(math.exp(-g / 2), rel=1e-10)  # chi-square, 2 dof
    # Swapping the samples changes nothing but their order.
    swapped = homogeneity(b, a)
    assert swapped.statistic == pytest.approx(g, rel=1e-12)
    assert (swapped.p_value, swapped.samples) == (result.p_value, (60, 60))
    # The control: identical samples have G = 0 and p = 1.
    same = homogeneity(a, dict(a))
    assert (same.statistic, same.p_value) == (0.0, 1.0)
    assert result.p_value < 1e-6


# ---------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------


def test_rare_categories_are_pooled_into_one_other_cell() -> None:
    rare = range(10, 20)  # ten tokens drawn once in each sample: expected 1 each, below 5
    a = {1: 60, 2: 40, **dict.fromkeys(rare, 1)}
    b = {1: 50, 2: 50, **dict.fromkeys(rare, 1)}
    result = homogeneity(a, b)
    assert (result.categories, result.pooled, result.dof, result.samples) == (3, 10, 2, (110, 110))
    # The table is (60, 50), (40, 50), (10, 10); N = 220, both rows 110, so E is half each column.
    g = 2 * (60 * math.log(60 / 55) + 50 * math.log(50 / 55) + 40 * math.log(40 / 45) + 50 * math.log(50 / 45) + 0.0)
    assert result.statistic == pytest.approx(g, rel=1e-12)
    assert result.p_value == pytest.approx(math.exp(-g / 2), rel=1e-10)
    assert result.entry()["pooled"] == 10
    # The control: with no minimum every token is its own category.
    unpooled = homogeneity(a, b, min_expected=0.0)
    assert (unpooled.categories, unpooled.pooled, unpooled.dof) == (12, 0, 11)


def test_an_other_cell_still_too_rare_joins_the_smallest_category() -> None:
    # n_a = 103, n_b = 99, N = 202. Tokens 3, 4 and 6 (3, 3 and 1 draws) are rare; together (3, 4),
    # seven draws, expected 7 x 99 / 202 = 3.4 in b: still rare, so they join token 2 (95 < 100).
    # Token 5 was never drawn and is no category at all.
    a = {1: 50, 2: 50, 3: 2, 4: 1, 5: 0}
    b = {1: 50, 2: 45, 3: 1, 4: 2, 6: 1}
    result = homogeneity(a, b)
    assert (result.categories, result.pooled, result.dof, result.samples) == (2, 3, 1, (103, 99))
    table = [(50, 50), (53, 49)]
    g = 2 * math.fsum(o * math.log(o * 202 / (n * (x + y))) for x, y in table for o, n in ((x, 103), (y, 99)))
    assert result.statistic == pytest.approx(g, rel=1e-12)
    # The control: a table that merged the other cell into token 1 instead would read differently.
    wrong = [(52, 52), (50, 45)]
    g_wrong = 2 * math.fsum(o * math.log(o * 202 / (n * (x + y))) for x, y in wrong for o, n in ((x, 103), (y, 99)))
    assert result.statistic != pytest.approx(g_wrong, rel=1e-3)


def test_rare_in_either_sample_is_rare() -> None:
    # 20 draws against 200: token 3's 30 draws in all expect 30 x 20 / 220 = 2.7 in the small
    # sample (27 in the large one), so it is pooled.
    a, b = {1: 10, 2: 7, 3: 3}, {1: 100, 2: 73, 3: 27}
    assert homogeneity(a, b).pooled == 1
    # The control: at 200 draws each, the same proportions expect 30 of token 3 in both: kept.
    assert homogeneity({1: 100, 2: 70, 3: 30}, b).pooled == 0


def test_nothing_to_distinguish_in_one_category() -> None:
    one = homogeneity({5: 10}, {5: 8})
    assert (one.statistic, one.dof, one.p_value, one.categories, one.pooled) == (0.0, 0, 1.0, 1, 0)
    assert indistinguishable(one)
    every_one_rare = homogeneity({1: 1, 2: 1}, {3: 1})  # and with 3 draws, so is every token
    assert (every_one_rare.dof, every_one_rare.p_value, every_one_rare.categories, every_one_rare.pooled) == (
        0,
        1.0,
        1,
        3,
    )
    # The control: two categories, each all of one sample, are as distinguishable as it gets.
    apart = homogeneity({5: 10}, {6: 10})
    assert apart.statistic == pytest.approx(2 * (10 * math.log(2) + 10 * math.log(2)))  # E = 5 in all four cells
    assert (apart.dof, apart.categories) == (1, 2)
    assert not indistinguishable(apart)


def test_an_empty_sample_is_named() -> None:
    with pytest.raises(ValueError, match=r"sample a \(the first\) is empty"):
        homogeneity({}, {1: 4})
    with pytest.raises(ValueError, match=r"sample b \(the second\) is empty"):
        homogeneity({1: 4}, {1: 0, 2: 0})
    with pytest.raises(ValueError, match="negative count"):
        homogeneity({1: 4, 2: -1}, {1: 4})
    assert homogeneity({1: 4}, {1: 4}).samples == (4, 4)  # the control: one draw each is enough


def test_the_report_entry() -> None:
    result = Homogeneity(12.3456789, 3, 0.00123456789, (4000, 4001), 4, 1)
    entry = result.entry()
    assert entry == {
        "test": "G",
        "statistic": 12.346,
        "dof": 3,
        "p_value": 0.00123457,
        "samples": [4000, 4001],
        "categories": 4,
        "pooled": 1,
    }
    assert json.loads(json.dumps(entry)) == entry
    assert Homogeneity(0.0, 0, 1.0, (1, 1), 1, 0).entry()["p_value"] == 1.0
    assert Homogeneity(500.0, 30, 1.234567890123e-90, (1, 1), 31, 0).entry()["p_value"] == 1.23457e-90
    # The control: indistinguishable() holds p to the 0.01, strictly.
    assert ALPHA == 0.01
    assert indistinguishable(Homogeneity(1.0, 1, 0.0100001, (1, 1), 2, 0))
    assert not indistinguishable(Homogeneity(1.0, 1, 0.01, (1, 1), 2, 0))
    assert indistinguishable(Homogeneity(1.0, 1, 0.02, (1, 1), 2, 0), alpha=0.01)
    assert not indistinguishable(Homogeneity(1.0, 1, 0.02, (1, 1), 2, 0), alpha=0.05)


# ---------------------------------------------------------------------------------------------
# statistical behaviour: sampled tokens, seeded
# ---------------------------------------------------------------------------------------------

SAMPLES = 4000  # draws per server: the sample size the check's result states
VOCABULARY = 64
LOGITS = [-0.06 * i + g for i, g in enumerate(random.Random(17).gauss(0.0, 0.25) for _ in range(VOCABULARY))]


def distribution(temperature: float = 1.0, top_k: int = 50, top_p: float = 0.9) -> dict[int, float]:
    """What a server samples from: softmax(logits / T), then top-k and top-p as SGLang's torch sampler.

    top-p is taken on the untruncated probabilities: a token stays while the mass before it is at
    most top_p; the kept mass is renormalized.
    """
    scaled = [logit / temperature for logit in LOGITS]
    top = max(scaled)
    weights = [math.exp(s - top) for s in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    kept: dict[int, float] = {}
    before = 0.0
    for token in sorted(range(VOCABULARY), key=lambda t: -probs[t])[:top_k]:
        if before > top_p:
            break
        kept[token] = probs[token]
        before += probs[token]
    mass = sum(kept.values())
    return {token: p / mass for token, p in kept.items()}


def draw(dist: dict[int, float], n: int, rng: random.Random) -> Counter[int]:
    tokens = list(dist)
    return Counter(rng.choices(tokens, weights=[dist[t] for t in tokens], k=n))


def test_the_sampling_distributions() -> None:
    plain = distribution()
    assert len(plain) == 36  # top-p 0.9 cuts before top-k 50 does: ~40 categories
    assert sum(plain.values()) == pytest.approx(1.0)
    assert len(distribution(top_p=1.0)) == 50
    assert len(distribution(0.7)) == 27  # sharper: top-p keeps fewer tokens


def test_the_same_distribution_is_indistinguishable_and_another_temperature_is_not() -> None:
    rng = random.Random(0)
    plain, dynspec = draw(distribution(), SAMPLES, rng), draw(distribution(), SAMPLES, rng)
    same = homogeneity(plain, dynspec)
    assert same.samples == (SAMPLES, SAMPLES)
    assert same.categories == 36
    assert same.p_value > ALPHA
    assert indistinguishable(same)
    # The negative control of issue 17: a server sampling at temperature 0.7.
    cooler = homogeneity(plain, draw(distribution(0.7), SAMPLES, rng))
    assert cooler.p_value < 1e-6
    assert not indistinguishable(cooler)


def test_a_small_difference_shows_at_this_size() -> None:
    # Temperature 0.9 for 1.0 moves a few percent of the mass toward the head; 4000 draws see it
    # (over 200 seeds, the largest p was 2e-8).
    rng = random.Random(1)
    plain = draw(distribution(), SAMPLES, rng)
    warmer = homogeneity(plain, draw(distribution(0.9), SAMPLES, rng))
    assert warmer.p_value < 1e-4
    assert not indistinguishable(warmer)
    # Top-k 30 for 50 (the tail cut early) shows too.
    assert not indistinguishable(homogeneity(plain, draw(distribution(top_k=30), SAMPLES, rng)))
    # The control: another sample of the plain distribution, from the same generator, does not.
    assert indistinguishable(homogeneity(plain, draw(distribution(), SAMPLES, rng)))


def rejection_rate(alternative: dict[int, float], n: int, min_expected: float, runs: int = 1000) -> float:
    rng = random.Random(2)
    null = distribution(top_p=1.0)
    rejected = 0
    for _ in range(runs):
        result = homogeneity(draw(null, n, rng), draw(alternative, n, rng), min_expected=min_expected)
        rejected += result.p_value <= 0.05
    return rejected / runs


def test_the_test_holds_its_level_where_pooling_is_needed() -> None:
    # 400 draws from the 50-token top-k tail: ~20 of the tokens expect fewer than 5 draws. Pooled,
    # samples of one distribution are told apart at p <= 0.05 about 5 % of the time (6-7 % over
    # generator seeds 2 to 6; binomial sd 0.7 % over 1000 runs): the p-value means what it says.
    tail = distribution(top_p=1.0)
    pooled = rejection_rate(tail, 400, 5.0)
    assert 0.03 <= pooled <= 0.085
    # The control: without pooling, G's chi-square approximation fails in the sparse cells and the
    # test rejects about twice as often as it says (10-14 % over seeds 2 to 6).
    assert rejection_rate(tail, 400, 0.0) > 0.09
    # And the level does not come from a test without power: at the same size, temperature 0.6 is
    # rejected almost every time (0.7: 60 %).
    assert rejection_rate(distribution(0.6, top_p=1.0), 400, 5.0, runs=300) > 0.9
