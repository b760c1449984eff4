"""The node agent, in its own process on every node: forks the node's ranks from a warm interpreter, watches them,
stops them all when one fails, and leaves nothing behind."""
