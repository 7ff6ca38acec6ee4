"""A model repository in Triton's layout: reading it, checking it, watching it.

    layout               ``ModelRepository``: model directories, their versions and backends
    poll                 ``RepositoryPoller``: poll mode, loading what changed on disk
    fingerprint          what a model directory looks like on disk, to tell a change
    pbtxt                the protobuf text format of ``config.pbtxt``, as plain values
    config               ``ModelConfig``: Triton's ModelConfig as frozen pydantic models
    config_file          one ``config.pbtxt`` read and checked into a ``ModelConfig``
    autocomplete         an ONNX model's config completed from the model file
    optimization_config  ``optimization``: execution accelerators
    warmup_config        ``model_warmup``: the samples a version runs before it is ready
    overrides            a load request's config and files, checked and written to disk
    safe_paths           relative paths from configs and requests, kept inside their folder

Running the warmup samples is the loader's job (``workers.warmup``), not this package's.
"""
