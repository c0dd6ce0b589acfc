"""Child processes of `python -m dqn_cartpole`: the commands they run (and the commands printed to continue a
run), and the one supervisor that starts, restarts, stops and reads them (sweep, tune and the local topology)."""
