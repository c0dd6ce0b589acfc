"""Roles as separate processes over one Reverb server: replay-server, collect, learn, and the local launcher."""
