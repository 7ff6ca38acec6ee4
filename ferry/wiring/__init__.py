"""Each process built once from its settings and run under one ``AsyncExitStack``."""
