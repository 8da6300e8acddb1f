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
