"""Queueing of requests on a pool of serving instances (the stated approximation).

Prompts arrive as a Poisson stream and each attention rank of a prefill-serving instance is one
server with exponential service, so the wait is that of an M/M/c queue (Erlang C; Kleinrock,
Queueing Systems Vol. 1, Sec. 3.5): P(W > t) = C(c, a) exp(-(c mu - lambda) t). Time to first
token at quantile q is the service time at that quantile's prompt length plus the wait quantile.
Decode slots must hold every sequence in flight (Little's law: lambda x time in decode). A
colocated instance shares its time between prefill and decode steps (chunked prefill): decode steps
stretch by 1 / (1 - prefill share), prefill servers slow by 1 / (1 - decode share).
"""

from __future__ import annotations

import numpy as np


def erlang_c(servers, load):
    """Probability that an arrival waits in an M/M/c queue with ``servers`` and offered ``load``
    (= lambda / mu); 1 when the queue is unstable. Erlang B is the Poisson ratio
    B(c, a) = P(X = c) / P(X <= c), X ~ Poisson(a), evaluated in logs so that thousands of servers
    stay exact (P(X <= c) = Q(c + 1, a), the regularized upper incomplete gamma function), and
    C = c B / (c - a (1 - B)) (Kleinrock Vol. 1, Sec. 3.5). Vectorized."""
    from scipy.special import gammaincc, gammaln

    servers, load = np.broadcast_arrays(np.asarray(servers, dtype=float), np.asarray(load, dtype=float))
    load = np.maximum(load, 1e-300)
    with np.errstate(all="ignore"):
        log_pmf = servers * np.log(load) - load - gammaln(servers + 1)
        b = np.exp(log_pmf - np.log(np.maximum(gammaincc(servers + 1, load), 1e-300)))
        stable = load < servers
        c = servers * b / np.where(stable, servers - load * (1 - b), 1.0)
    return np.where(stable, np.nan_to_num(np.clip(c, 0.0, 1.0), nan=1.0), 1.0)


def wait_quantile(servers, service_s, rate, q):
    """The q-quantile of the wait in an M/M/c queue: max(0, ln(C / (1 - q)) / (c mu - lambda)).
    ``q`` may be a tuple of quantiles: then a dict by quantile, Erlang C evaluated once for all."""
    servers = np.asarray(servers, dtype=float)
    mu = 1.0 / np.asarray(service_s, dtype=float)
    slack = servers * mu - rate
    c = erlang_c(servers, rate / mu)
    waits = {}
    for p in (q if isinstance(q, tuple) else (q,)):
        t = np.log(np.maximum(c / (1.0 - p), 1e-300)) / np.where(slack > 0, slack, 1.0)
        waits[p] = np.where(slack > 0, np.maximum(t, 0.0), np.inf)
    return waits if isinstance(q, tuple) else waits[q]


def pool_latencies(role: str, instances, rate: float, output_mean: float, batch, servers_per_instance,
                   prefill_s50, prefill_s90, tpot50, tpot90, quantiles=(0.5, 0.9)):
    """(TTFT by quantile, TPOT p50, TPOT p90, utilization, sequences in flight per instance) of
    ``instances`` instances in ``role`` ("prefill", "decode" or "colocated") carrying ``rate``
    requests/s. Vectorized over configurations and counts."""
    n = np.asarray(instances, dtype=float)
    per_instance = rate / n
    decode_tokens_per_s = batch / np.maximum(tpot50, 1e-12)
    decode_share = per_instance * output_mean / decode_tokens_per_s if role != "prefill" else 0.0
    prefill_share = per_instance * prefill_s50 / servers_per_instance if role != "decode" else 0.0
    stretch_prefill = 1.0 / np.maximum(1.0 - decode_share, 1e-9) if role == "colocated" else 1.0
    stretch_decode = 1.0 / np.maximum(1.0 - prefill_share, 1e-9) if role == "colocated" else 1.0
    servers = n * servers_per_instance
    # The prompt's service at the quantile's length: known at p50 and p90 (a higher quantile takes p90's).
    service = {q: (prefill_s90 if q >= 0.9 else prefill_s50) * stretch_prefill for q in quantiles}
    if role != "decode":
        waits = wait_quantile(servers, prefill_s50 * stretch_prefill, rate, tuple(quantiles))
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
