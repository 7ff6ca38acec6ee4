"""Which GPU an instance runs on.

Triton places ``count`` instances on each GPU an instance group lists; ferry
numbers instances across the model, so it spreads them over the listed GPUs
round-robin. A group that lists none spreads them over every visible GPU
(``visible``; GPU 0 when the caller cannot count them).
"""

from __future__ import annotations

from workers.repository.config import InstanceGroup

GPU_KINDS = frozenset({"KIND_GPU", "KIND_AUTO"})


def gpu_device(instance: InstanceGroup, instance_index: int, visible: int = 1) -> int:
    gpus = instance.gpus or tuple(range(max(visible, 1)))
    return gpus[instance_index % len(gpus)]
