"""Which GPU an instance runs on.

Triton places ``count`` instances on each GPU an instance group lists; ferry
numbers instances across the model, so it spreads them over the listed GPUs
round-robin. A group that lists none uses GPU 0.
"""

from __future__ import annotations

from workers.config import InstanceGroup

GPU_KINDS = frozenset({"KIND_GPU", "KIND_AUTO"})


def gpu_device(instance: InstanceGroup, instance_index: int) -> int:
    return instance.gpus[instance_index % len(instance.gpus)] if instance.gpus else 0
