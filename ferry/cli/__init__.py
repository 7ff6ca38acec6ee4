"""The command line: ``main`` dispatches each command, ``options`` and ``settings`` turn flags
into the frozen settings objects the wiring is built from; ``lag`` and ``speech`` are client commands."""
