"""Queueing of requests on a pool of serving instances (the stated approximation).

Prompts arrive as a Poisson stream and each attention rank of a prefill-serving instance is one
server with exponential service, so the wait is that of an M/M/c queue (Erlang C; Kleinrock,
Queueing Systems Vol. 1, Sec. 3.5): P(W > t) = C(c, a) exp(-(c mu - lambda) t). Time to first
token at quantile q is the service time at that quantile's prompt length plus the wait quantile.
Decode slots must hold every sequence in flight (Little's law: lambda x time in decode).

A colocated instance runs its prompts in one of two ways (``mixed``, per configuration):
- in batches of their own, between decode steps (SGLang's default): decode steps stretch by
  1 / (1 - prefill share), prefill servers slow by 1 / (1 - decode share);
- as chunks inside the decode steps (mixed batches: vLLM's and TensorRT-LLM's in-flight batching;
  Agrawal et al., Sarathi-Serve, OSDI 2024): each attention rank's iteration carries its decode
  batch and up to a chunk of prompt tokens. The prompt lane is one server per attention rank whose
  service is a prompt's chunks, new tokens / chunk x the mixed step T_m; its load u = lambda_rank x
  that service. Iterations carrying a chunk make up a share rho = u T / T_m of them, so the mean
  step is T = T_d + rho (T_m - T_d), i.e. T = T_d / (1 - u (1 - T_d / T_m)), T_d the decode-only
  step: TPOT; a prompt's first token comes after its chunks, at least one mixed step.
"""

from __future__ import annotations

import numpy as np


# Erlang B by quadrature of its integral: panel edges in widths of the peak (w below), Gauss-Legendre
# nodes per panel, and the tail cut where the integrand is below exp(-w_max^2 / 2) of its peak.
# 6 panels x 10 nodes meet 2e-11 relative against a 30-digit reference for integer 1 <= c <= 1e8
# (tests/perfmodel/test_queueing.py); 4.5-width panels of 12 nodes (48 in all) reach only 7e-10.
_PANEL_EDGES = (0.0, 2.5, 5.0, 9.5)
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(10)


def _log_peak(servers, load):
    """g* = c ln(c / a) - (c - a): the log of the Erlang B integrand's peak (see erlang_c), >= 0 for a <= c."""
    return servers * np.log1p((servers - load) / load) - (servers - load)


def _erlang_b_integral(servers, load):
    """I = exp(-g*) / B(c, a) = int_{a-c}^inf exp(-h(x)) dx for stable rows (a < c), x the offset
    from the integrand's peak (see erlang_c), by Gauss-Legendre on panels whose edges sit at w peak
    widths: x = -w sqrt(c) on the left (h(x) >= x^2 / (2c) there, so 9.5 widths leave e^-45), and
    x = w sqrt(c) + w^2 / 2 on the right, where h is about w^2 / 2 + w^3 / (6 sqrt(c)) for large c
    and grows like the exponential tail x - c ln(x / c) for small c (at least w^2 / 2 on the tests'
    grid, 1 to 1e8 servers)."""
    nodes, weights = _NODES, _WEIGHTS
    c, a = servers[:, None], load[:, None]
    width = np.sqrt(c)
    edges = np.asarray(_PANEL_EDGES)[None, :]
    right = edges * width + edges * edges / 2.0
    left = np.maximum(-edges * width, a - c)
    bounds = np.concatenate([left[:, :0:-1], right], axis=1)   # ascending; clipped left panels are empty
    lo, hi = bounds[:, :-1, None], bounds[:, 1:, None]
    x = (lo + hi) / 2.0 + (hi - lo) / 2.0 * nodes
    h = x - c[:, :, None] * np.log1p(x / c[:, :, None])
    return ((hi - lo) / 2.0 * weights * np.exp(-h)).sum(axis=(1, 2))


def erlang_c(servers, load):
    """Probability that an arrival waits in an M/M/c queue with ``servers`` and offered ``load``
    (= lambda / mu); 1 when the queue is unstable. C = c B / (c - a (1 - B)) (Kleinrock Vol. 1,
    Sec. 3.5) from the Erlang B loss probability B(c, a), here by its integral representation
    (Jagerman 1974, "Some properties of the Erlang loss function", Bell Syst. Tech. J. 53(3)):

        1 / B(c, a) = int_0^inf exp(-s) (1 + s / a)^c ds,

    which for integer c is the Poisson form sum_k c! / ((c - k)! a^k) term by term (expand the
    binomial; int s^k e^-s ds = k!), and continues it to real c. With s = x + c - a its log
    integrand is g* - h(x), h(x) = x - c ln(1 + x / c) >= 0, peaked at x = 0 (s* = c - a) with
    width sqrt(c), and g* = c ln(c / a) - (c - a). So B = exp(-g*) / I with
    I = int_{a-c}^inf exp(-h(x)) dx, by fixed-node Gauss-Legendre quadrature on panels in widths
    of the peak, 9.5 widths each way (_erlang_b_integral): the cost does not grow with c. Rows
    with g* > 700 have B < e^-700 / I (I >= sqrt(pi c / 2)): C = 0 there.
    Servers are counts (instances x attention ranks): for integer c the integrand left of the peak
    is a polynomial times exp(-s) and the panels meet 2e-11 relative against a 30-digit reference
    from 1 to 1e8 servers, and the incomplete-gamma form (SciPy) to 1e-9 where C > 1e-12 and that
    form is itself exact to that (tests/perfmodel/test_queueing.py). Vectorized."""
    servers, load = np.broadcast_arrays(np.asarray(servers, dtype=float), np.asarray(load, dtype=float))
    return _erlang_c_where(servers, load, np.ones(servers.shape, dtype=bool))


def _erlang_c_where(servers, load, needed):
    """erlang_c on the rows ``needed`` (where a < c); 0 on the other stable rows, 1 where unstable."""
    servers, load = np.broadcast_arrays(np.asarray(servers, dtype=float), np.asarray(load, dtype=float))
    load = np.maximum(load, 1e-300)
    stable = load < servers
    out = np.where(stable, 0.0, 1.0)
    with np.errstate(all="ignore"):
        peak = np.where(stable, _log_peak(servers, load), np.inf)
    rows = np.flatnonzero(stable & needed & (peak <= 700.0))
    if len(rows):
        c, a = servers.ravel()[rows], load.ravel()[rows]
        b = np.exp(-peak.ravel()[rows]) / _erlang_b_integral(c, a)
        out.ravel()[rows] = np.clip(c * b / ((c - a) + a * b), 0.0, 1.0)
    return out


def erlang_c_bound(servers, load):
    """An upper bound on erlang_c, cheap: B <= exp(-g*) / sqrt(pi c / 2) (the integral's right half,
    h(x) <= x^2 / (2c) for x >= 0) and C <= c B / (c - a); 1 where unstable."""
    servers, load = np.broadcast_arrays(np.asarray(servers, dtype=float), np.asarray(load, dtype=float))
    load = np.maximum(load, 1e-300)
    stable = load < servers
    with np.errstate(all="ignore"):
        bound = servers / (servers - load) * np.exp(-_log_peak(servers, load)) / np.sqrt(np.pi * servers / 2.0)
    return np.where(stable, np.minimum(np.nan_to_num(bound, nan=1.0, posinf=1.0), 1.0), 1.0)


def wait_quantile(servers, service_s, rate, q, exact: bool = True):
    """The q-quantile of the wait in an M/M/c queue: max(0, ln(C / (1 - q)) / (c mu - lambda)).
    ``q`` may be a tuple of quantiles: then a dict by quantile, Erlang C evaluated once for all.
    The wait is 0 wherever C <= 1 - q, so Erlang C is evaluated exactly only where its bound
    (erlang_c_bound) exceeds 1 - q; elsewhere the bound, itself <= 1 - q, gives the same 0.
    Without ``exact`` the bound stands in everywhere: an upper bound on the wait, never below it."""
    servers = np.asarray(servers, dtype=float)
    mu = 1.0 / np.asarray(service_s, dtype=float)
    slack = servers * mu - rate
    quantiles = q if isinstance(q, tuple) else (q,)
    servers, load = np.broadcast_arrays(servers, rate / mu)
    bound = erlang_c_bound(servers, load)
    c = bound
    if exact:
        needed = bound > 1.0 - max(quantiles)
        c = np.where(needed, _erlang_c_where(servers, load, needed), bound)
    waits = {}
    for p in quantiles:
        t = np.log(np.maximum(c / (1.0 - p), 1e-300)) / np.where(slack > 0, slack, 1.0)
        waits[p] = np.where(slack > 0, np.maximum(t, 0.0), np.inf)
    return waits if isinstance(q, tuple) else waits[q]


def pool_shares(role: str, instances, rate: float, output_mean: float, batch, servers_per_instance, prefill_s50,
                tpot50, mixed50=0.0):
    """(decode share, prefill share) of each instance's time when ``instances`` instances in
    ``role`` carry ``rate`` requests/s: its decode steps at full batch and its prompts, one per
    attention rank at a time. Both fall as 1 / instances, so a pool's load is K / n, K its load
    on one instance (a pool needs n > K to be stable). A colocated instance that mixes prompt
    chunks into its decode steps (``mixed50`` > 0, its mixed step) spends no time on decode steps
    of their own: its prefill share is the prompt lane's load (``prefill_s50``: a prompt's chunks)."""
    per_instance = rate / np.asarray(instances, dtype=float)
    decode_tokens_per_s = batch / np.maximum(tpot50, 1e-12)
    decode_share = per_instance * output_mean / decode_tokens_per_s if role != "prefill" else 0.0
    if role == "colocated":
        decode_share = np.where(np.asarray(mixed50) > 0, 0.0, decode_share)
    prefill_share = per_instance * prefill_s50 / servers_per_instance if role != "decode" else 0.0
    return decode_share, prefill_share


def pool_latencies(role: str, instances, rate: float, output_mean: float, batch, servers_per_instance,
                   prefill_s50, prefill_s90, tpot50, tpot90, quantiles=(0.5, 0.9), mixed50=0.0, mixed90=0.0,
                   exact: bool = True):
    """(TTFT by quantile, TPOT p50, TPOT p90, utilization, sequences in flight per instance) of
    ``instances`` instances in ``role`` ("prefill", "decode" or "colocated") carrying ``rate``
    requests/s. Vectorized over configurations and counts. ``mixed50``/``mixed90`` (> 0 where a
    colocated configuration mixes prompt chunks into its decode steps): the mixed step per token
    emitted at the p50 and p90 contexts; ``prefill_s50``/``prefill_s90`` are then a prompt's chunks.
    Without ``exact`` the TTFTs are upper bounds (wait_quantile), the rest exact."""
    n = np.asarray(instances, dtype=float)
    per_instance = rate / n
    decode_share, prefill_share = pool_shares(role, n, rate, output_mean, batch, servers_per_instance, prefill_s50,
                                              tpot50, mixed50)
    stretch_prefill = 1.0 / np.maximum(1.0 - decode_share, 1e-9) if role == "colocated" else 1.0
    stretch_decode = 1.0 / np.maximum(1.0 - prefill_share, 1e-9) if role == "colocated" else 1.0
    floor = {0.5: 0.0, 0.9: 0.0}
    if role == "colocated" and np.any(np.asarray(mixed50) > 0):
        mixed = np.asarray(mixed50) > 0
        # Mixed batches: each step carries a chunk with probability rho (module docstring).
        saving = 1.0 - np.asarray(tpot50) / np.where(mixed, mixed50, 1.0)
        stretch_decode = np.where(mixed, 1.0 / np.maximum(1.0 - prefill_share * saving, 1e-9), stretch_decode)
        floor = {0.5: np.where(mixed, mixed50, 0.0), 0.9: np.where(mixed, mixed90, 0.0)}
    servers = n * servers_per_instance
    # The prompt's service at the quantile's length: known at p50 and p90 (a higher quantile takes p90's);
    # in mixed batches at least the one step that emits the first token.
    service = {q: np.maximum((prefill_s90 if q >= 0.9 else prefill_s50) * stretch_prefill, floor[0.9 if q >= 0.9
                                                                                                  else 0.5])
               for q in quantiles}
    if role != "decode":
        waits = wait_quantile(servers, prefill_s50 * stretch_prefill, rate, tuple(quantiles), exact)
        ttft = {q: service[q] + waits[q] for q in quantiles}
    else:
        ttft = {q: np.zeros_like(np.asarray(prefill_s50, dtype=float)) for q in quantiles}
    in_flight = per_instance * output_mean * tpot50 * stretch_decode
    return ttft, tpot50 * stretch_decode, tpot90 * stretch_decode, decode_share + prefill_share, in_flight


def rate_from_concurrency(users: float, ttft_s: float, tpot_s: float, output_tokens: float) -> float:
    """Requests per second that ``users`` closed-loop users issue when each request takes the
    latency targets (Little's law, lambda = N / W with W = TTFT + output x TPOT): a conservative
    rate, since requests answered faster than their targets come back sooner."""
    return users / (ttft_s + output_tokens * tpot_s)
