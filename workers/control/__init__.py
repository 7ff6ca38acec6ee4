"""The control channel that loads and unloads models across a fleet: the messages, the
listener every worker runs and the client a gateway uses."""
