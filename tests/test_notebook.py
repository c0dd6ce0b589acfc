"""notebooks/dqn_tutorial.ipynb: committed without outputs, then run headless top to bottom in a real Jupyter kernel
(nbclient, as `Run All` does) on a short version of its parameters cell: its cells must show the tutorial's plot, the
trained agent's video and the comparison. In the same kernel, interrupting it (what a notebook's stop button does:
SIGINT to the kernel's process group) stops a run with a checkpoint, and `train(resume=run)` continues it."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import threading
import time

import pytest

from helpers import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "dqn_tutorial.ipynb")
# The tutorial's config, short: every cell runs, and each of the two trainings takes a few seconds.
SHORT = {"training.num_iterations": 200, "training.initial_collect_steps": 100, "training.log_interval": 50,
         "training.checkpoint_interval": 100, "evaluation.eval_interval": 100, "evaluation.num_eval_episodes": 2,
         "video.num_episodes": 1, "video.random_episodes": 1, "output.tensorboard": False}
# The second run: Rainbow's three switches (prioritized replay on the tutorial's Reverb table, dueling and noisy
# networks) instead of the notebook's n-step targets and Double DQN, so the comparison covers them at no extra run.
CHANGES = {"replay.prioritized": True, "network.dueling": True, "network.noisy": True}
CELL_TIMEOUT_S = 300  # a cell that takes longer fails the test (a training here takes ~10 s)
VIDEO = re.compile(r'src="data:video/mp4;base64,([A-Za-z0-9+/=]+)"')


def read_notebook():
    import nbformat

    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_notebook_is_committed_without_outputs_and_with_one_parameters_cell():
    notebook = read_notebook()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert [cell.source.split(" ", 1)[0] for cell in code if "parameters" in cell.metadata.get("tags", [])] == \
        ["CONFIG"]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """The notebook, its cells run one after another in a Jupyter kernel that stays up: (notebook, client, folder)."""
    from nbclient import NotebookClient

    folder = tmp_path_factory.mktemp("notebook")
    notebook = read_notebook()
    (parameters,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    parameters.source = (f"CONFIG = 'tutorial'\nOVERRIDES = {SHORT!r}\nOUTPUT_DIR = {str(folder / 'runs')!r}\n"
                         f"CHANGES = {CHANGES!r}")
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(folder)}})
    # The kernel imports this checkout, in the environment a user's Jupyter has: without the test run's
    # TF_CPP_MIN_LOG_LEVEL (conftest.py), which would hide TensorFlow's C++ lines before the package could, and
    # without PYTEST_CURRENT_TEST, which turns off ipykernel's capture of fd 2 (the C++ libraries' lines reach a
    # user's cells through it).
    env = {key: value for key, value in os.environ.items()
           if key not in ("TF_CPP_MIN_LOG_LEVEL", "PYTEST_CURRENT_TEST")}
    env.update(PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    with client.setup_kernel(env=env):
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        yield notebook, client, folder


def outputs_of(notebook, needle: str) -> list:
    """The outputs of the one code cell whose source contains `needle`."""
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and needle in c.source]
    return cell.outputs


def data_of(outputs: list, mime: str) -> list[str]:
    return [out["data"][mime] for out in outputs if "data" in out and mime in out["data"]]


def text_of(outputs: list) -> str:
    return "".join(out.get("text", "") for out in outputs)


def test_run_all_shows_the_plot_the_video_and_the_comparison(kernel):
    notebook, _, folder = kernel
    # The environment's frame, the tutorial's plot and the two runs' curves are images.
    assert data_of(outputs_of(notebook, "frame = PIL.Image.fromarray"), "image/png")
    assert data_of(outputs_of(notebook, 'plt.plot(iterations, metrics["average_return"])'), "image/png")
    assert data_of(outputs_of(notebook, 'plt.plot(m["env_steps"]'), "image/png")
    # The run shows its outcome, its returns plot and the trained agent's video, embedded from its folder.
    (shown,) = data_of([out for cell in notebook.cells if cell.cell_type == "code" and cell.source.strip() == "run"
                        for out in cell.outputs], "text/html")
    # the tutorial checks for no solve (stop_when_solved: false): the view says so, and calls it neither way
    assert "data:image/png;base64," in shown and "No solve check ran" in shown and "Not solved" not in shown
    (video,) = VIDEO.findall(shown)
    mp4 = base64.b64decode(video)
    assert mp4[4:8] == b"ftyp" and len(mp4) > 10_000
    with open(folder / "runs" / "tutorial" / "videos" / "trained-agent.mp4", "rb") as handle:
        assert handle.read() == mp4
    (comparison,) = data_of(outputs_of(notebook, "comparison = dq.compare"), "text/html")
    assert "data:image/png;base64," in comparison
    # The groups are named by the keys they differ in: the three switches.
    assert "network.dueling=true, network.noisy=true, replay.prioritized=true" in comparison, comparison[-3000:]
    switched = folder / "runs" / "prioritized-true-dueling-true-noisy-true"
    assert (switched / "plots" / "priorities.png").is_file()  # it trained on prioritized replay
    # Both trainings ran to their end in the kernel, and the hand-made loop trained.
    for needle in ("run = dq.train(", "run_b = dq.train("):
        outputs = outputs_of(notebook, needle)
        text = text_of(outputs)
        assert "Done in" in text and "200 iterations" in text, text[-2000:]
        # tqdm.auto's bar: a widget with ipywidgets installed, else the text bar the notebook redraws
        assert data_of(outputs, "application/vnd.jupyter.widget-view+json") or "200/200 it [" in text
    assert "step = 200: loss = " in text_of(outputs_of(notebook, "collect_driver.run"))
    assert re.search(r"10 greedy episodes: mean \d", text_of(outputs_of(notebook, "run.evaluate(episodes=10)")))


# What a notebook's cells printed before the package quieted the kernel (issue 41): TensorFlow's C++ `E` lines on
# a machine without a GPU, gym's notice (TF-Agents imports the legacy gym), Reverb's writer warning.
NOISE = ("Unable to register cuDNN factory", "Unable to register cuBLAS factory", "Gym has been unmaintained",
         "The number of pending items is alarmingly high", "This TensorFlow binary is optimized")


def test_the_cells_print_no_library_noise(kernel):
    notebook, _, _ = kernel
    errors = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for out in cell.outputs if out.get("name") == "stderr")
    assert "Training CartPole-v0" in errors  # the stderr of the cells is what is read here
    assert [noise for noise in NOISE if noise in errors] == []


def interrupt_at_first_checkpoint(client, checkpoints: str) -> None:
    """Waits for a checkpoint of the run in the kernel, then interrupts the kernel as Jupyter's stop button does."""
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while not (os.path.isdir(checkpoints) and any(n.startswith("ckpt-") and "." not in n
                                                  for n in os.listdir(checkpoints))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    asyncio.run(client.km.interrupt_kernel())


def test_interrupting_the_kernel_stops_a_run_with_a_checkpoint_and_resume_continues_it(kernel):
    import nbformat

    _, client, folder = kernel
    run_dir = str(folder / "runs" / "interrupted")
    cells = [nbformat.v4.new_code_cell(source) for source in (
        f'stopped = dq.train("smoke", output_dir={run_dir!r}, progress=False, overrides='
        f'{{"training.num_iterations": 1_000_000, "video.enabled": False, "output.tensorboard": False}})',
        'print("stopped", stopped.stopped, stopped.summary["iterations"])',
        'resumed = dq.train(resume=stopped, progress=False, overrides={"training.num_iterations": '
        'stopped.summary["iterations"] + 100})\nprint("resumed", resumed.summary["iterations"])')]
    interrupter = threading.Thread(target=interrupt_at_first_checkpoint,
                                   args=(client, os.path.join(run_dir, "checkpoints")))
    interrupter.start()
    client.execute_cell(cells[0], 0)  # raises CellExecutionError if the interrupt escaped as KeyboardInterrupt
    interrupter.join()
    errors = "".join(out.get("text", "") for out in cells[0].outputs if out.get("name") == "stderr")
    assert "SIGINT received: stopping at the next step boundary" in errors
    assert f"Resume with:\n  dqn_cartpole.train(resume={run_dir!r})" in text_of(cells[0].outputs)
    client.execute_cell(cells[1], 1)
    stopped_at = int(re.fullmatch(r"stopped True (\d+)\n", text_of(cells[1].outputs)).group(1))
    assert 100 <= stopped_at < 1_000_000  # after the first periodic checkpoint (at 100), long before the end
    assert f"ckpt-{stopped_at:010d}" in os.listdir(os.path.join(run_dir, "checkpoints"))  # the stop's own
    client.execute_cell(cells[2], 2)
    assert f"resumed {stopped_at + 100}\n" in text_of(cells[2].outputs)
    assert f"Resuming {run_dir}" in text_of(cells[2].outputs)
