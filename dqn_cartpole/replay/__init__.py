"""Replay, split by side: the interface and the uniform buffers, Reverb's tables and server, and its client and writers."""
