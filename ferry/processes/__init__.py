"""Several processes behind one command: ``--http-workers N`` forks N HTTP gateways sharing
one port (``SO_REUSEPORT``) beside the worker, supervised by the process that started them;
``ferry serve`` then runs its broker as a bundled Valkey server (``valkey.py``)."""
