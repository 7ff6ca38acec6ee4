"""Ensembles: a model whose steps are other models, each called over the broker.

    config     ``ensemble_scheduling`` validated (pydantic), and its checks
    plan       the steps as a dependency graph: which step runs when
    caller     the ``StepCaller`` seam: send a step's request, await its response
    broker     ``BrokerStepCaller``: over a transport, with a reply channel of its own
    runner     ``EnsembleRunner``: hosts an ensemble in a worker, in place of a ModelRunner
"""
