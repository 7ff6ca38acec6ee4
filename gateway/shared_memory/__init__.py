"""Triton's system shared memory extension: a co-located client hands tensors
over in POSIX shared memory instead of the HTTP body.

    refs.py      what a tensor's parameters say: RegionSlice, RegionInput (pure)
    regions.py   SharedMemoryRegions: register, resolve, read, write, unregister, close
    binding.py   one infer request's inputs read, and its outputs bound and written
    routes.py    /v2/systemsharedmemory/... (and CUDA's, which has no regions here)

Nothing is imported here: ``gateway.v2_codec`` imports ``refs``, and
``binding`` imports ``gateway.v2_codec``.
"""
