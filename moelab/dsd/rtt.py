"""Round-trip times as distributions: measured loopback samples, scaled shapes, and the closed form's jitter.

- :func:`measure_loopback_rtt` times TCP ping-pongs of a small payload (one drafted block's worth) through an
  echo server on 127.0.0.1 on this machine: the network stack's own floor, jitter and tail.
- :meth:`RTTDistribution.empirical` resamples measured samples; :meth:`RTTDistribution.scaled` keeps a
  distribution's *shape* (its spread relative to its mean) and moves its mean, so a WAN round trip can
  inherit a measured tail.
- :meth:`RTTDistribution.lognormal` builds a heavy-tailed WAN shape through a median and a 95th percentile.
  The :data:`WAN_SCENARIOS` are such shapes; the facts they are anchored on are cited in ``source`` and the
  lognormal form through them is an assumption, labelled ``assumed=True``.
- :meth:`RTTDistribution.uniform` is the closed form's own jitter law, ``U(rtt(1-j), rtt(1+j))``.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from moelab._validate import check_array, check_int, check_loopback_host, check_real

MAX_SAMPLES = 1_000_000
_Z95 = 1.6448536269514722


@dataclass(frozen=True)
class RTTDistribution:
    """A round-trip-time law in ms: resampled ``samples``, or lognormal (``mu``, ``sigma`` of log-ms)."""

    name: str
    samples: np.ndarray | None = None
    mu: float = 0.0
    sigma: float = 0.0
    scale: float = 1.0
    uniform_jitter: float | None = None  # the closed form's law when set (with mean `scale`)
    source: str = ""
    assumed: bool = False

    @classmethod
    def constant(cls, rtt_ms: float) -> RTTDistribution:
        """Every round trip takes ``rtt_ms`` ms (0..1e6)."""
        rtt_ms = check_real("rtt_ms", rtt_ms, low=0, high=1e6)
        return cls(f"constant {rtt_ms:g} ms", uniform_jitter=0.0, scale=rtt_ms, source="constant")

    @classmethod
    def uniform(cls, rtt_ms: float, jitter: float) -> RTTDistribution:
        """``U(rtt(1-j), rtt(1+j))``: the jitter law of the closed forms (:func:`moelab.dsd.latency_per_token`)."""
        rtt_ms = check_real("rtt_ms", rtt_ms, low=0, high=1e6)
        jitter = check_real("jitter", jitter, low=0, high=1)
        return cls(f"uniform {rtt_ms:g} ms +-{jitter:.0%}", uniform_jitter=jitter, scale=rtt_ms,
                   source="the closed form's jitter law")

    @classmethod
    def empirical(cls, samples_ms: np.ndarray, name: str = "measured", source: str = "") -> RTTDistribution:
        """Resample measured round trips ``samples_ms`` (ms, >= 0, 2..:data:`MAX_SAMPLES` of them, positive mean)."""
        s = check_array("samples_ms", samples_ms, ndim=1, low=0, dtype=np.float64)
        if s.size < 2 or s.size > MAX_SAMPLES:
            raise ValueError(f"samples_ms must hold 2..{MAX_SAMPLES} samples; got {s.size}")
        if s.mean() <= 0:
            raise ValueError("samples_ms must have a positive mean")
        return cls(name, samples=np.sort(s), source=source)

    @classmethod
    def lognormal(cls, p50_ms: float, p95_ms: float, name: str = "lognormal", source: str = "",
                  assumed: bool = True) -> RTTDistribution:
        """A lognormal law through a median and a 95th percentile (``p95 > p50 > 0``)."""
        p50 = check_real("p50_ms", p50_ms, low=0, low_open=True, high=1e6)
        p95 = check_real("p95_ms", p95_ms, low=p50, low_open=True, high=1e6)
        return cls(name, mu=math.log(p50), sigma=math.log(p95 / p50) / _Z95, source=source, assumed=assumed)

    @property
    def mean(self) -> float:
        """Mean round-trip time, ms."""
        if self.uniform_jitter is not None:
            return self.scale
        if self.samples is not None:
            return float(self.samples.mean()) * self.scale
        return math.exp(self.mu + self.sigma**2 / 2) * self.scale

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100) of the round-trip time, ms."""
        q = check_real("q", q, low=0, high=100)
        if self.uniform_jitter is not None:
            return self.scale * (1 - self.uniform_jitter + 2 * self.uniform_jitter * q / 100)
        if self.samples is not None:
            return float(np.percentile(self.samples, q)) * self.scale
        return math.exp(self.mu + self.sigma * norm.ppf(min(max(q / 100, 1e-12), 1 - 1e-12))) * self.scale

    def share_above(self, rtt_ms: float) -> float:
        """The share of round trips longer than ``rtt_ms`` ms (``P(RTT > rtt_ms)``, 0..1).

        Parameters
        ----------
        rtt_ms : float
            The threshold, ms (0..1e6); e.g. the drafting window ``gamma*t_a`` that pipelined DSD hides.

        Returns
        -------
        float
            The share of this law's round trips that exceed the threshold.
        """
        rtt_ms = check_real("rtt_ms", rtt_ms, low=0, high=1e6)
        if self.uniform_jitter is not None:
            lo, hi = self.scale * (1 - self.uniform_jitter), self.scale * (1 + self.uniform_jitter)
            if hi <= lo:
                return float(self.scale > rtt_ms)
            return float(np.clip((hi - rtt_ms) / (hi - lo), 0.0, 1.0))
        if self.samples is not None:
            return float(np.mean(self.samples * self.scale > rtt_ms))
        if self.scale == 0 or rtt_ms == 0:
            return float(self.scale > 0)
        return float(norm.sf((math.log(rtt_ms / self.scale) - self.mu) / self.sigma))

    def mean_excess_over(self, rtt_ms: float) -> float:
        """The mean of ``max(RTT - rtt_ms, 0)``, ms: what a round pays on average beyond ``rtt_ms``.

        Pipelined DSD hides a round trip up to its drafting window ``gamma*t_a``; past it each round pays the
        leftover, so this, taken at the window, is what such a law adds to every round on average.

        Parameters
        ----------
        rtt_ms : float
            The threshold, ms (0..1e6).

        Returns
        -------
        float
            ``E[max(RTT - rtt_ms, 0)]`` in ms.
        """
        rtt_ms = check_real("rtt_ms", rtt_ms, low=0, high=1e6)
        if self.uniform_jitter is not None:
            lo, hi = self.scale * (1 - self.uniform_jitter), self.scale * (1 + self.uniform_jitter)
            if hi <= lo:
                return max(self.scale - rtt_ms, 0.0)
            if rtt_ms <= lo:
                return self.scale - rtt_ms
            return float(max(hi - rtt_ms, 0.0) ** 2 / (2 * (hi - lo)))
        if self.samples is not None:
            return float(np.mean(np.maximum(self.samples * self.scale - rtt_ms, 0.0)))
        if self.scale == 0 or rtt_ms == 0:
            return self.mean
        # lognormal: E[(X - k)+] = E[X] Phi(d + sigma) - k Phi(d), d = (mu + ln scale - ln k) / sigma
        d = (self.mu + math.log(self.scale) - math.log(rtt_ms)) / self.sigma
        return float(self.mean * norm.cdf(d + self.sigma) - rtt_ms * norm.cdf(d))

    def scaled(self, mean_ms: float) -> RTTDistribution:
        """The same shape with mean ``mean_ms`` (every sample multiplied by one factor)."""
        mean_ms = check_real("mean_ms", mean_ms, low=0, high=1e6)
        factor = mean_ms / self.mean if self.mean > 0 else 0.0
        return RTTDistribution(f"{self.name} scaled to mean {mean_ms:g} ms", self.samples, self.mu, self.sigma,
                               self.scale * factor, self.uniform_jitter, self.source, self.assumed)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` round-trip times (ms) drawn with ``rng`` (a numpy Generator)."""
        n = check_int("n", n, low=0, high=MAX_SAMPLES * 100)
        if not isinstance(rng, np.random.Generator):  # an AttributeError deep in numpy before
            raise ValueError(f"rng must be a numpy Generator (np.random.default_rng(seed)); got {type(rng).__name__}")
        if self.uniform_jitter is not None:
            if self.uniform_jitter == 0 or self.scale == 0:
                return np.full(n, self.scale)
            return self.scale * (1.0 + self.uniform_jitter * rng.uniform(-1.0, 1.0, size=n))
        if self.samples is not None:
            return self.samples[rng.integers(0, self.samples.size, size=n)] * self.scale
        return np.exp(rng.normal(self.mu, self.sigma, size=n)) * self.scale


def measure_loopback_rtt(n: int = 2000, payload_bytes: int = 64, host: str = "127.0.0.1") -> np.ndarray:
    """``n`` TCP round trips of ``payload_bytes`` through an echo thread on loopback, in ms.

    Nagle is off on both ends; the first 20 round trips are a discarded warm-up. Only loopback hosts
    are accepted (nothing leaves the machine).

    Parameters
    ----------
    n : int
        Round trips measured (2..100000).
    payload_bytes : int
        Bytes sent each way (1..65536; one drafted block's worth by default).
    host : str
        A loopback address.

    Returns
    -------
    ndarray of float
        ``n`` round-trip times, ms (e.g. for :meth:`RTTDistribution.empirical`).
    """
    n = check_int("n", n, low=2, high=100_000)
    payload_bytes = check_int("payload_bytes", payload_bytes, low=1, high=65_536)
    host = check_loopback_host("host", host)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(1)
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                data = conn.recv(65_536)
                if not data:
                    return
                conn.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    payload = b"x" * payload_bytes
    out = np.empty(n)
    with socket.create_connection((host, port), timeout=10) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(-20, n):
            t0 = time.perf_counter()
            c.sendall(payload)
            got = 0
            while got < payload_bytes:
                chunk = c.recv(65_536)
                if not chunk:
                    raise ConnectionError("loopback echo closed early")
                got += len(chunk)
            if i >= 0:
                out[i] = (time.perf_counter() - t0) * 1e3
    thread.join(timeout=5)
    server.close()
    return out


#: WAN shapes: lognormal through (p50, p95). Anchors (cited facts) and the assumption are in `source`.
WAN_SCENARIOS: dict[str, RTTDistribution] = {
    "mobile-nearby": RTTDistribution.lognormal(
        35.0, 90.0, "mobile, nearby cloud region",
        "assumed shape; anchor: Rizvi, Heidemann, Plonka, 'Third-Party Assessment of Mobile Performance in the 5G "
        "Era' (arXiv 2507.18834, 2025): only the top 5% of mobile users regularly see a minimum latency below "
        "20 ms, so a typical median lies above that; p95 ~2.6x the median models the heavy tail (retransmissions, "
        "handovers, queueing: Berger, Rohde & Schwarz mobile network testing blog, 2021, part 4)"),
    "cross-continent": RTTDistribution.lognormal(
        150.0, 260.0, "cross-continent",
        "assumed shape; a ~150 ms median for a transatlantic/transpacific path plus a 95th percentile tail; "
        "not a measurement of this lab"),
}


__all__ = ["RTTDistribution", "WAN_SCENARIOS", "measure_loopback_rtt"]
