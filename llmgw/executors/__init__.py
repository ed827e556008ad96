"""Executors: the only code that touches nodes, engines, GitHub and the network."""
