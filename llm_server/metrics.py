"""Engine counters for Prometheus (`/metrics`), read at scrape time from the engine's stats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.generation import Engine


class EngineCollector:
    """Engine counters, read at scrape time so /metrics and /v1/stats never disagree."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        s = self.engine.stats
        for name, value, doc in (
            ("llm_requests", s.requests, "generation requests admitted"),
            ("llm_rows", s.rows, "sequences generated (n per request)"),
            ("llm_prefill_batches", s.prefill_batches, "prefill forward passes"),
            ("llm_decode_steps", s.decode_steps, "decode forward passes (one token for every running row)"),
            ("llm_prompt_tokens", s.prompt_tokens, "prompt tokens prefilled"),
            ("llm_generated_tokens", s.generated_tokens, "tokens generated"),
            ("llm_weight_updates", s.weight_updates, "weight updates applied"),
            ("llm_constrained_rows", s.constrained_rows, "sequences generated under a structured-output grammar"),
            ("llm_constrained_tokens", s.constrained_tokens, "tokens sampled under a grammar mask"),
            ("llm_mixed_decode_steps", s.mixed_decode_steps, "decode steps shared by constrained and free rows"),
            ("llm_grammar_mask_seconds", s.mask_seconds, "time spent computing and applying grammar masks"),
            ("llm_prefill_seconds", s.prefill_seconds, "time in prompt forward passes (decoding waits for them)"),
            ("llm_decode_seconds", s.decode_seconds, "time in decode steps, sampling included"),
            ("llm_resumed_rows", s.resumed_rows, "requests resumed from a finished request's kept cache"),
            ("llm_reused_prefix_tokens", s.reused_prefix_tokens, "prompt tokens taken from kept caches"),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family
        for name, value, doc in (
            ("llm_active_rows", self.engine.active_rows, "rows in the running batch"),
            ("llm_queued_requests", self.engine.queued, "requests waiting to join the batch"),
            ("llm_policy_version", self.engine.policy_version, "version of the served weights"),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
