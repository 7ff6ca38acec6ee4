"""Tools run before serving, never by a worker: each is a ``python -m`` command.

    tensorrt_build  an ONNX file built into a TensorRT engine (``model.plan``)
    trees_export    a trusted scikit-learn pickle exported as a Treelite checkpoint
"""
