"""The sequence batcher: Triton's stateful-model scheduling, and where each sequence runs.

    config.py          ``sequence_batching`` as frozen pydantic models, and its checks
    table.py           which steps run next (direct or oldest), slots, idle expiry; pure
    controls.py        the START/END/READY/CORRID tensors of a batch; pure
    state.py           initial implicit state, and the store that checkpoints it
    batcher.py         the driver: queues steps, runs batches, threads state through
    sessions.py        the session routing seam: handle a step here or forward it; one process
    sessions_redis.py  session routing for a Redis fleet: ownership, forwarding, adoption
"""
