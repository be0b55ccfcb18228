"""Bounded retries for provider calls: jittered exponential backoff, or what the cloud asked for.

Bounded in attempts and in time so a throttled cloud slows one tick down, never stalls the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from autoscaler.model.errors import ThrottledError, TransientError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    max_total_s: float = 20.0
    base_s: float = 0.5
    max_wait_s: float = 8.0
    sleep: Callable[[float], None] = field(default=time.sleep)

    def call(self, fn: Callable[[], T]) -> T:
        jitter = wait_random_exponential(multiplier=self.base_s, max=self.max_wait_s)

        def wait(state: RetryCallState) -> float:
            outcome = state.outcome
            error = outcome.exception() if outcome is not None else None
            if isinstance(error, ThrottledError) and error.retry_after_s is not None:
                return min(error.retry_after_s, self.max_wait_s)
            return float(jitter(state))

        retrying = Retrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_total_s),
            wait=wait,
            sleep=self.sleep,
            reraise=True,
        )
        return retrying(fn)


NO_RETRY = RetryPolicy(attempts=1)
