"""Cloud ML platform contracts on a port of their own: SageMaker's (``/ping``,
``/invocations``, multi-model ``/models``) and Vertex AI's (its health and
predict routes). Each translates its platform's requests into the V2 routes of
the main app and answers in the platform's shape, so a request behaves there
exactly as it does on ``/v2``: same batching, errors, metrics and tracing."""
