"""Triton Python-backend models served unchanged.

A ``model.py`` that defines ``class TritonPythonModel`` (``initialize``,
``execute``, ``finalize``, and optionally ``auto_complete_config``) and imports
``triton_python_backend_utils`` is run by ``adapter.TritonPythonBackend``
behind ferry's backend seam; ``pb_utils.py`` is the module those models import
under Triton's name. ``bls.py`` carries a model's own inference requests
(``pb_utils.InferenceRequest(...).exec()``) over the broker to the models they
name, wherever they are served.
"""
