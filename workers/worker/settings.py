"""What one worker is told at start: its id, its models, and its limits."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from broker import channels
from workers.control.messages import ControlSettings
from workers.deadletter import DeadLetterSettings
from workers.recovery import RecoverySettings


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    models: tuple[str, ...] = ()  # empty: every model in the repository
    fetch_count: int = 64
    max_in_flight: int = 512  # deliveries of one model in hand, computed ones whose replies are on their way included
    prefetch: int = 2  # rounds of a model's instance capacity taken to compute (computing, or waiting to)
    poll_timeout_s: float = 1.0
    channel_prefix: str = channels.PREFIX
    recovery: RecoverySettings = RecoverySettings()
    control: ControlSettings = ControlSettings()
    dead_letters: DeadLetterSettings = DeadLetterSettings()
    rate_limit: str = "off"  # "execution_count": instances run when their rate_limiter resources are free
    rate_limit_resources: tuple[tuple[str, int], ...] = ()  # --rate-limit-resource NAME:COUNT
