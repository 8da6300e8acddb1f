"""Prometheus metrics, one registry per app so that apps (and tests) never share counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class Metrics:
    """The service's counters and histograms; labels carry routes and codes, never text."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "grounding_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "grounding_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["route", "method"],
            registry=self.registry,
        )
        self.verifications = Counter(
            "grounding_verifications",
            "Answer verifications by outcome and code",
            ["outcome", "code"],
            registry=self.registry,
        )
        self.citations_issued = Counter(
            "grounding_citations_issued", "Citations issued", registry=self.registry
        )
        self.erasures = Counter(
            "grounding_erasures", "Erasures carried out", registry=self.registry
        )
        self.integrity_errors = Counter(
            "grounding_integrity_errors",
            "Excerpts whose stored text no longer matched its hash",
            registry=self.registry,
        )
        # A request's counter and histogram by route, method and status: `labels` looks them up
        # under a lock on every call, three times the cost of counting. The labels are bounded
        # (route templates, methods, statuses), and so is this.
        self._request_series: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}

    def observe_request(self, *, route: str, method: str, status: str, seconds: float) -> None:
        """Count one request and time it, by its route template, method and status."""
        key = (route, method, status)
        series = self._request_series.get(key)
        if series is None:
            series = self._request_series[key] = (
                self.requests.labels(route=route, method=method, status=status),
                self.latency.labels(route=route, method=method),
            )
        count, latency = series
        count.inc()
        latency.observe(seconds)
