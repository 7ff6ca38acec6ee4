"""The ``ferry`` command and the wiring of its processes: the composition root that puts
``gateway``, ``workers`` and ``broker`` together (``cli/`` parses, ``wiring/`` builds and runs)."""
