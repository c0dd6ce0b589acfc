"""Everything a person looks at: the figures, the videos and the HTML report of a run.

`figures` and `html` read a run folder through `dqn_cartpole.run_folder` and never import
TensorFlow, so `report RUN_DIR` starts fast. `video` plays a policy, so it needs TF-Agents.
"""
