"""report.html's tables, in-process on a hand-made run folder: what applies, what the user changed, readable numbers."""

import os
import re

import pytest
import yaml

from browser import find_chromium, run_chromium

from dqn_cartpole.config import dump_written, load, to_dict
from dqn_cartpole.report.run_page import write_run_report
from dqn_cartpole.run_folder import RunLayout, write_summary
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS


def make_run(root: str, overrides=(), distributed: bool = False, written: bool = True) -> RunLayout:
    layout = RunLayout(root)
    os.makedirs(root)
    loaded = load(None, list(overrides))
    write_text_atomic(layout.config, yaml.safe_dump(to_dict(loaded.config)))  # as train writes
    if written:  # as train writes it (an older version's run folder has none)
        write_text_atomic(layout.written_config, dump_written(loaded.written))
    log = CsvLog(layout.eval_metrics, EVAL_COLUMNS)
    log.write({"train_step": 0, "env_steps": 1000, "average_return": 9.4, "min_return": 8.0, "max_return": 11.0,
               "std_return": 0.912345, "average_discounted_return": 9.01234, "average_max_q_at_reset": 0.123456,
               "average_episode_length": 9.4, "num_episodes": 10, "wall_s": 12.3456})
    log.write({"train_step": 12500, "env_steps": 13500, "average_return": 500.0, "wall_s": 61.25})
    log.close()
    write_summary(layout.summary, {"iterations": 12500, "env_steps": 13500, "best_return": 500.0, "wall_s": 61.2,
                                   "final_return": 500.0, "solved_at_iteration": None,
                                   "provenance": {"package_version": "0.1.0", "git_commit": "abc123",
                                                  "git_dirty": True, "tensorflow": "2.15.1"}})
    if distributed:
        os.makedirs(layout.roles)
    return layout


def section(page: str, heading: str) -> str:
    return page.split(f"<h2>{heading}</h2>", 1)[1].split("</section>", 1)[0]


def keys_listed(page: str) -> list[str]:
    return re.findall(r'<td class="key">([a-z_]+\.[a-z_]+)</td>', section(page, "Config"))


def test_a_plain_default_run_differs_in_nothing_and_lists_only_what_applies(tmp_path):
    page = open(write_run_report(make_run(str(tmp_path / "run")).root), encoding="utf-8").read()
    config = section(page, "Config")
    assert "the user changed none" in config and 'class="changed"' not in config and "Highlighted" not in config
    # the table agrees with the count: what auto became is shown as such
    assert '<td class="key">replay.sampling</td><td>direct (from auto)</td><td>auto</td>' in config
    listed = keys_listed(page)
    assert "replay.sampling" in listed and "agent.gamma" in listed
    assert not [k for k in listed if k.startswith("distributed.") or k.startswith("replay.reverb_")]
    assert "replay.prefetch" not in listed  # tf_uniform is read directly, not through tf.data


def test_a_changed_key_is_highlighted_and_a_distributed_run_lists_its_section(tmp_path):
    layout = make_run(str(tmp_path / "run"), ["agent.learning_rate=5e-4", "replay.backend=reverb"], distributed=True)
    page = open(write_run_report(layout.root), encoding="utf-8").read()
    changed = re.findall(r'<tr class="changed"><td class="key">([^<]+)</td>', page)
    assert sorted(changed) == ["agent.learning_rate", "replay.backend"]  # sampling: auto -> dataset is no change
    assert {"distributed.samples_per_insert", "replay.reverb_port", "replay.prefetch"} <= set(keys_listed(page))


@pytest.mark.parametrize("written", [True, False])
def test_only_what_the_user_wrote_is_highlighted(tmp_path, written):
    """With config.written.yaml (train writes it) a key is changed when written with another value; an older run
    folder without it is compared by its resolved values, an auto resolved being no change."""
    layout = make_run(str(tmp_path / "run"), ["agent.learning_rate=1e-3"], written=written)
    config = section(open(write_run_report(layout.root), encoding="utf-8").read(), "Config")
    assert re.findall(r'<tr class="changed"><td class="key">([^<]+)</td>', config) == ["agent.learning_rate"]
    assert "Highlighted: the key the user changed from configs/default.yaml" in config
    assert '<td class="key">replay.sampling</td><td>direct (from auto)</td><td>auto</td>' in config


def test_a_value_written_on_purpose_is_a_change_even_if_auto_means_it(tmp_path):
    layout = make_run(str(tmp_path / "run"), ["replay.sampling=direct"])
    config = section(open(write_run_report(layout.root), encoding="utf-8").read(), "Config")
    assert re.findall(r'<tr class="changed"><td class="key">([^<]+)</td>', config) == ["replay.sampling"]
    assert '<td class="key">replay.sampling</td><td>direct</td><td>auto</td>' in config


def test_evaluations_are_formatted_and_the_provenance_is_shown(tmp_path):
    page = open(write_run_report(make_run(str(tmp_path / "run")).root), encoding="utf-8").read()
    table = section(page, "Evaluations")
    assert "<th>iteration</th><th>env steps</th><th>average return</th>" in table
    assert "<td>12,500</td><td>13,500</td><td>500.0</td>" in table
    assert "<td>0.9</td><td>9.01</td><td>0.12</td>" in table  # std, discounted return, max-Q at the first states
    assert "0.912345" not in table and "12.3456" not in table
    assert '<div class="scroll">' in table  # a wide table scrolls instead of widening the page
    provenance = section(page, "Provenance")
    assert "abc123 (with uncommitted changes)" in provenance and "2.15.1" in provenance


@pytest.mark.skipif(find_chromium() is None, reason="no chromium or chromium-browser on PATH")
def test_the_page_fits_a_1280_px_window(tmp_path):
    """No horizontal scroll bar at 1280 px: the widest things are the tables (the plots and videos scale down)."""
    layout = make_run(str(tmp_path / "run"))
    log = CsvLog(layout.eval_metrics, EVAL_COLUMNS)
    for i in range(3):  # large numbers, as a long run logs
        log.write({"train_step": 1_234_567 + i, "env_steps": 9_876_543, "average_return": -123456.789,
                   "min_return": -123456.789, "max_return": -123456.789, "std_return": 12345.6789,
                   "average_discounted_return": -98765.4321, "average_max_q_at_reset": -98765.4321,
                   "average_episode_length": 123456.7, "num_episodes": 100, "wall_s": 123456.789})
    log.close()
    page = write_run_report(layout.root)
    probe = os.path.join(layout.root, "probe.html")
    script = ('<script>window.addEventListener("load", function () { var p = document.createElement("pre"); '
              'p.id = "width"; p.textContent = document.documentElement.scrollWidth + " " + '
              'document.documentElement.clientWidth; document.body.appendChild(p); });</script>')
    with open(page, encoding="utf-8") as source, open(probe, "w", encoding="utf-8") as target:
        target.write(source.read().replace("</body>", script + "</body>"))
    dom, _ = run_chromium(find_chromium(), ["--window-size=1280,900", "--virtual-time-budget=3000", "--dump-dom",
                                            f"file://{probe}"], str(tmp_path / "profile"))
    scroll_width, client_width = map(int, re.search(r'<pre id="width">(\d+) (\d+)</pre>', dom).groups())
    assert scroll_width <= client_width, f"the page is {scroll_width} px wide in a {client_width} px window"


def test_a_written_key_this_version_does_not_know_is_ignored(tmp_path):
    layout = make_run(str(tmp_path / "run"), ["agent.learning_rate=1e-3"])
    with open(layout.written_config, "a", encoding="utf-8") as handle:
        handle.write("agent:\n  learning_rate: 0.001\n  retired_key: 3\nold_section:\n  x: 1\n")  # a newer or older run
    config = section(open(write_run_report(layout.root), encoding="utf-8").read(), "Config")
    assert re.findall(r'<tr class="changed"><td class="key">([^<]+)</td>', config) == ["agent.learning_rate"]


def with_policies(layout: RunLayout, final: float, best: float, final_episodes: int = 100, best_episodes: int = 100,
                  best_iteration: int = 12500) -> None:
    """summary.json's `policies`, as a run that trained on past its best writes them."""
    import json

    with open(layout.summary, encoding="utf-8") as handle:
        summary = json.load(handle)
    summary["policies"] = {
        "final": {"what": "the weights at the last step", "iteration": 20000, "env_steps": 21000,
                  "average_return": final, "episodes": final_episodes, "solved": False},
        "best": {"what": "the weights of the best periodic evaluation", "iteration": best_iteration,
                 "env_steps": best_iteration + 1000, "average_return": best, "episodes": best_episodes,
                 "solved": False}}
    write_summary(layout.summary, summary)


@pytest.mark.parametrize("final, warned", [(121.8, True), (455.0, False), (500.0, False)])
def test_the_report_says_in_one_line_when_policy_final_is_much_worse_than_policy_best(tmp_path, final, warned):
    layout = make_run(str(tmp_path / "run"))
    with_policies(layout, final=final, best=500.0)
    page = open(write_run_report(layout.root), encoding="utf-8").read()
    intro = page.split("<h2>", 1)[0]
    # What each policy is, with its score, in the facts at the top.
    assert (f"<span>policy/final</span>{final:.1f} over 100 episodes, iteration 20,000: the weights at the last "
            f"step") in intro
    assert ("<span>policy/best</span>500.0 over 100 episodes, iteration 12,500: the weights of the best periodic "
            "evaluation") in intro
    lines = re.findall(r'<p class="outcome unsolved final-worse">([^<]*)</p>', intro)
    if warned:
        assert lines == [f"policy/final ({final:.1f} over 100 episodes) is much worse than policy/best (500.0 at "
                         f"iteration 12,500): the agent lost what it had learnt; keep policy/best (evaluate RUN uses "
                         f"it by default)."]
    else:
        assert lines == [] and "much worse" not in page


@pytest.mark.parametrize("final_episodes, best_episodes, best_iteration, warned", [
    (10, 10, 12500, True),  # a real loss: the same number of episodes, a best that had learnt
    (100, 10, 12500, False),  # the luckiest of many 10-episode samples against one of 100: not comparable
    (10, 100, 12500, False),
    (3, 3, 0, False),  # the best is the untrained network's (the API page's smoke run: 116.0 over 3 at iteration 0)
    (None, None, 12500, False),  # episode counts unknown
])
def test_policy_final_is_held_against_policy_best_only_over_as_many_episodes_and_never_the_untrained_network(
        final_episodes, best_episodes, best_iteration, warned):
    from dqn_cartpole.report.facts import final_much_worse_line
    from dqn_cartpole.training.outcome import summary_lines

    policies = {"final": {"average_return": 40.0, "episodes": final_episodes, "iteration": 20000, "what": "last"},
                "best": {"average_return": 116.0, "episodes": best_episodes, "iteration": best_iteration,
                         "what": "best"}}
    line = final_much_worse_line(policies, 195.0)
    assert (line is not None) == warned
    summary = {"wall_s": 1.0, "iterations": 1, "train_steps": 1, "env_steps": 1, "best_return": 116.0,
               "final_return": 40.0, "solved_at_iteration": None, "policies": policies, "solve_return_target": 195.0,
               "resumed_from": None, "checkpoint_bytes": None, "artifacts": {"x": "y"}, "run_dir": "RUN"}
    printed = "\n".join(summary_lines(summary))  # the line train prints at its end is the report's
    assert ("much worse" in printed) == warned
    if warned:
        assert line.startswith("policy/final (40.0 over 10 episodes) is much worse than policy/best (116.0 at "
                               "iteration 12,500)")


def test_a_run_without_scored_policies_has_no_line_about_them(tmp_path):
    page = open(write_run_report(make_run(str(tmp_path / "run")).root), encoding="utf-8").read()
    assert "<span>policy/final</span>-" in page and "much worse" not in page


@pytest.mark.parametrize("prioritized", [True, False])
def test_a_prioritized_run_shows_its_importance_weights_and_priorities_and_a_uniform_one_does_not(tmp_path,
                                                                                                  prioritized):
    from dqn_cartpole.report import figures
    from dqn_cartpole.run_folder.metrics import TRAIN_COLUMNS

    sets = ["replay.backend=py_uniform", "replay.prioritized=true"] if prioritized else []
    layout = make_run(str(tmp_path / "run"), sets)
    log = CsvLog(layout.train_metrics, TRAIN_COLUMNS)
    for i, (weight, mean, peak) in enumerate([(0.31, 0.8, 4.5), (0.52, 0.4, 2.0), (0.74, 0.2, 1.1)]):
        extras = {"importance_weight_min": weight, "priority_mean": mean, "priority_max": peak} if prioritized else {}
        log.write({"train_step": 50 * (i + 1), "env_steps": 100 * (i + 1), "loss": 0.1, "epsilon": 0.1, **extras})
    log.close()
    drawn = figures.plot_run(layout)
    page = open(write_run_report(layout.root), encoding="utf-8").read()
    assert (layout.priorities_plot in drawn) == prioritized
    assert os.path.exists(layout.priorities_plot) == prioritized
    assert ("priorities.png" in section(page, "Plots")) == prioritized
    assert ("importance weights" in section(page, "Plots")) == prioritized
