"""Replay, split by side: the interface and uniform buffers, Reverb's tables and server, its client and writers."""
