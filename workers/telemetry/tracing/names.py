"""Span and attribute names, shared by the gateway's and the worker's spans."""

GATEWAY_INFER = "ferry.gateway.infer"  # the gateway: publish, then wait for the reply
WORKER_REQUEST = "ferry.worker.request"  # a worker: from enqueued to answered
QUEUE_WAIT = "ferry.queue_wait"  # on the broker: enqueued -> taken by the worker
BATCH_FORMATION = "ferry.batch_formation"  # in the dynamic batcher and waiting for an instance
COMPUTE = "ferry.compute"  # the model instance running the request's batch

MODEL = "ferry.model"
VERSION = "ferry.model_version"
REQUEST_ID = "ferry.request_id"
WORKER_ID = "ferry.worker_id"
BATCH_ID = "ferry.batch_id"
BATCH_SIZE = "ferry.batch_size"
ROWS = "ferry.rows"
OUTCOME = "ferry.outcome"
ASYNC_JOB = "ferry.async_job"
