"""Replication (docs/design.md §13): the master streams its commit log to its replicas over
the HA port (``master``), a replica follows it (``replica``), and sync replication waits for
their acknowledgements (``acks``). The frames are sans-IO in ``protocol/ha.py``."""
