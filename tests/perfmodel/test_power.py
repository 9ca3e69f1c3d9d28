"""perfmodel.power on a DGX H100: a phase's power runs from idle (no work) to TDP (GEMMs at the
achievable rate), rises with its FLOPs and bytes, and its energy per FLOP falls with the square of
the clock; a cap lowers the clock to the highest that fits (a 5% floor), adding time only when it
binds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.power import PhaseWork, capped_phase, device_power_w, phase_power_w, phase_seconds


def work(compute_s=0.0, memory_s=0.0, memory_flops=0.0, other_s=0.0, flops=0.0, hbm_bytes=0.0, precision="bf16"):
    a = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    return PhaseWork(a(compute_s), a(memory_s), a(memory_flops), a(other_s), a(flops), a(hbm_bytes), precision)


def gemm(m, seconds, share=1.0):
    """A compute-bound phase of ``seconds`` whose GEMMs run at ``share`` of the achievable rate."""
    return work(compute_s=seconds, flops=share * m.flops("bf16") * seconds)


# --- device_power_w and phase_power_w ----------------------------------------------------------


def test_device_power_is_linear_from_idle_to_tdp_and_clipped(m):
    assert m.idle_w < m.tdp_w
    p = device_power_w(m, [-0.5, 0.0, 0.25, 1.0, 2.0])
    np.testing.assert_allclose(p, [m.idle_w, m.idle_w, m.idle_w + 0.25 * (m.tdp_w - m.idle_w), m.tdp_w, m.tdp_w])


def test_no_work_draws_idle(m):
    assert phase_power_w(m, work(other_s=0.3)) == pytest.approx(m.idle_w)
    # A phase of no duration at all is still idle, not a division by zero.
    assert phase_power_w(m, work()) == pytest.approx(m.idle_w)


def test_gemms_at_the_achievable_rate_draw_tdp(m):
    assert phase_power_w(m, gemm(m, 0.02)) == pytest.approx(m.tdp_w, rel=1e-12)
    # At fp8 the achievable rate is fp8's own.
    fp8 = work(compute_s=0.02, flops=m.flops("fp8") * 0.02, precision="fp8")
    assert phase_power_w(m, fp8) == pytest.approx(m.tdp_w, rel=1e-12)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.9])
def test_power_is_linear_in_the_busy_share_of_flops(m, share):
    assert phase_power_w(m, gemm(m, 0.01, share)) == pytest.approx(m.idle_w + share * (m.tdp_w - m.idle_w))


def test_saturated_hbm_alone_draws_the_memory_weight(m):
    w = m.constants.power_memory_weight
    assert 0.0 < w < 1.0
    streaming = work(memory_s=0.01, hbm_bytes=m.hbm_bytes_per_s * 0.01)
    assert phase_power_w(m, streaming) == pytest.approx(m.idle_w + w * (m.tdp_w - m.idle_w))


def test_power_never_exceeds_tdp(m):
    both = work(compute_s=0.01, flops=m.flops("bf16") * 0.01, hbm_bytes=m.hbm_bytes_per_s * 0.01)
    assert phase_power_w(m, both) == pytest.approx(m.tdp_w)


def test_a_longer_actual_duration_spreads_the_energy(m):
    """``seconds`` twice the clocked duration: half the dynamic power."""
    p = phase_power_w(m, gemm(m, 0.01, 0.8), seconds=0.02)
    assert p == pytest.approx(m.idle_w + 0.4 * (m.tdp_w - m.idle_w))


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_power_is_monotone_in_work(m, f1, df, b1, db_):
    """More FLOPs or more HBM bytes in the same time never lower the power; it stays in [idle, TDP]."""
    t, rate, bw = 0.01, m.flops("bf16"), m.hbm_bytes_per_s
    p = phase_power_w(m, work(compute_s=t, flops=f1 * rate * t, hbm_bytes=b1 * bw * t))
    assert m.idle_w - 1e-9 <= p <= m.tdp_w + 1e-9
    assert phase_power_w(m, work(compute_s=t, flops=(f1 + df) * rate * t, hbm_bytes=b1 * bw * t)) >= p - 1e-9
    assert phase_power_w(m, work(compute_s=t, flops=f1 * rate * t, hbm_bytes=(b1 + db_) * bw * t)) >= p - 1e-9


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 1.0), st.floats(0.05, 1.0), st.floats(0.01, 1.0))
def test_energy_per_flop_falls_with_the_clock_squared(m, c1, c2, share):
    """Compute-bound work at clock c takes T / c and its dynamic energy is (TDP - idle) F / R x c^2."""
    w = gemm(m, 0.01, share)
    energy = []
    for c in (c1, c2):
        seconds = phase_seconds(m, w, c)
        assert seconds == pytest.approx(0.01 / c)
        energy.append((phase_power_w(m, w, c) - m.idle_w) * seconds)
    assert energy[0] == pytest.approx((m.tdp_w - m.idle_w) * share * 0.01 * c1 ** 2)
    assert energy[0] / energy[1] == pytest.approx((c1 / c2) ** 2)


def test_memory_bytes_cost_no_less_energy_at_a_lower_clock(m):
    """The HBM term is not clocked: a pure stream's power is the same at any core clock."""
    streaming = work(memory_s=0.01, hbm_bytes=m.hbm_bytes_per_s * 0.01)
    np.testing.assert_allclose(phase_power_w(m, streaming, np.array([0.2, 0.5, 1.0])),
                               phase_power_w(m, streaming))


def test_phase_seconds_keeps_memory_and_link_time_until_the_flops_no_longer_fit(m):
    rate = m.flops("bf16")
    w = work(compute_s=0.01, memory_s=0.02, memory_flops=0.005 * rate, other_s=0.003)
    assert phase_seconds(m, w, 1.0) == pytest.approx(0.033)
    assert phase_seconds(m, w, 0.5) == pytest.approx(0.02 + 0.02 + 0.003)      # 0.005 / 0.5 < 0.02
    assert phase_seconds(m, w, 0.1) == pytest.approx(0.1 + 0.05 + 0.003)       # 0.005 / 0.1 > 0.02


# --- capped_phase ------------------------------------------------------------------------------


def test_no_cap_is_full_clock_without_slowdown(m):
    w = gemm(m, np.array([0.01, 0.02]), 0.7)
    slow, power, clock = capped_phase(m, w, None)
    assert np.all(slow == 0.0) and np.all(clock == 1.0)
    np.testing.assert_array_equal(power, phase_power_w(m, w))


def test_a_cap_above_the_phases_power_changes_nothing(m):
    w = gemm(m, 0.01, 0.5)
    full = float(phase_power_w(m, w))
    for cap in (full, full + 1.0, m.tdp_w):
        slow, power, clock = capped_phase(m, w, cap)
        assert slow == 0.0 and clock == 1.0 and power == pytest.approx(full)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.1, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 800.0))
def test_a_cap_is_met_at_the_highest_clock_unless_at_the_floor(m, share, memory, cap):
    w = work(compute_s=0.01, flops=share * m.flops("bf16") * 0.01, hbm_bytes=memory * m.hbm_bytes_per_s * 0.01)
    slow, power, clock = capped_phase(m, w, cap)
    assert 0.05 <= clock <= 1.0
    if clock > 0.05:
        assert power <= cap + 1e-9
    else:
        assert phase_power_w(m, w, 0.05) > cap   # only the floor keeps it above
    if clock < 1.0:
        # The highest clock within the cap: a hair above it breaks the cap (bisection to ~1e-12).
        assert phase_power_w(m, w, min(clock + 1e-9, 1.0)) > cap
        assert slow == pytest.approx(0.01 / clock - 0.01)
    else:
        assert slow == 0.0


def test_slowdown_grows_as_the_cap_falls(m):
    w = gemm(m, 0.01, 0.9)
    caps = np.linspace(m.tdp_w, m.idle_w + 1.0, 25)
    results = [capped_phase(m, w, cap) for cap in caps]
    slow = np.array([float(r[0]) for r in results])
    clock = np.array([float(r[2]) for r in results])
    assert slow[0] == 0.0 and slow[-1] > 0.0
    assert np.all(np.diff(slow) >= 0.0) and np.all(np.diff(clock) <= 0.0)
    assert np.count_nonzero(np.diff(slow) > 0) >= 20


def test_a_cap_below_idle_holds_the_clock_at_its_floor(m):
    slow, power, clock = capped_phase(m, gemm(m, 0.01, 1.0), m.idle_w - 10.0)
    assert clock == 0.05 and power > m.idle_w - 10.0
    assert slow == pytest.approx(0.01 / 0.05 - 0.01)


def test_memory_bound_phase_slows_down_only_when_its_flops_no_longer_fit(m):
    """A stream of 10 ms whose 2 ms of FLOPs fit under it down to a 20% clock: a cap that lowers the
    clock to ~50% costs power but no time."""
    rate, weight, span = m.flops("bf16"), m.constants.power_memory_weight, m.tdp_w - m.idle_w
    w = work(memory_s=0.01, memory_flops=0.002 * rate, flops=0.002 * rate, hbm_bytes=m.hbm_bytes_per_s * 0.01)
    cap = m.idle_w + span * (weight + 0.2 * 0.5 ** 2)
    slow, power, clock = capped_phase(m, w, cap)
    assert clock == pytest.approx(0.5, abs=1e-6)
    assert slow == 0.0 and power <= cap + 1e-9


def test_capped_phase_is_vectorized_over_plans(m):
    w = gemm(m, np.array([0.01, 0.01, 0.01]), np.array([0.2, 0.6, 1.0]))
    cap = m.idle_w + 0.5 * (m.tdp_w - m.idle_w)
    slow, power, clock = capped_phase(m, w, cap)
    assert slow.shape == power.shape == clock.shape == (3,)
    assert slow[0] == 0.0 and clock[0] == 1.0            # draws 0.2 of the range: under the cap
    assert slow[1] > 0.0 and slow[2] > slow[1]
    assert np.all(power <= cap + 1e-9)
