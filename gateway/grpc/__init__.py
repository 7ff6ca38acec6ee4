"""Triton's gRPC protocol (``inference.GRPCInferenceService``), from the service
definitions ``tritonclient`` ships compiled: ``server`` starts it, ``servicer``
answers each RPC with the objects the HTTP door uses, ``tensors`` converts infer
messages, ``status`` gives errors their gRPC codes."""
