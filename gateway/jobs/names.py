"""Channel, group and key names for async jobs.

These belong in ``broker.channels``; they live here until that module is free
to edit, and should move there unchanged.
"""

from __future__ import annotations

from broker import channels


def job_reply_channel(prefix: str = channels.PREFIX) -> str:
    return f"{prefix}.jobs.replies"


def job_reply_group(prefix: str = channels.PREFIX) -> str:
    # One group shared by every gateway, so each job reply is stored once.
    return f"{prefix}.jobs.replies.gateways"


def job_key(job_id: str, prefix: str = channels.PREFIX) -> str:
    return f"{prefix}.job.{job_id}"
