"""The sequence batcher: Triton's stateful-model scheduling.

    table.py     which steps run next (direct or oldest), slots, idle expiry; pure
    controls.py  the START/END/READY/CORRID tensors of a batch; pure
    state.py     initial implicit state, and the store that checkpoints it
    batcher.py   the driver: queues steps, runs batches, threads state through
"""
