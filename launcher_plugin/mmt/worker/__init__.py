"""What runs inside every process the agent starts: one rank (the task function) or one command."""
