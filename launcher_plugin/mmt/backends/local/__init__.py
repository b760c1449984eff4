"""The local backend: N simulated nodes x M processes on this host, forked by one host agent."""
