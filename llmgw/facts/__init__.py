"""Pure facts: the command that asks a node something, and the parser of its answer."""
