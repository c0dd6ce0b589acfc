"""Headless Chromium for tests: find it, run it bounded in time, and probe a page in it.

The probe copies a page next to itself with a small script added that waits for `load` and for
every `<video>` to reach `loadeddata` (or fail), and collects window errors, failed resource loads
and `console.error` calls; Chromium's `--dump-dom` then hands back the JSON it wrote into the DOM.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
from typing import Optional

PROBE_SCRIPT = r"""
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    errors.push(t && t !== window ? "failed to load " + (t.currentSrc || t.src || t.tagName) : String(e.message));
  }, true);
  var consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    consoleError.apply(console, arguments);
  };
  function videoReady(v) {
    return new Promise(function (resolve) {
      function done() { resolve({src: v.currentSrc, readyState: v.readyState, duration: v.duration,
                                 error: v.error ? v.error.code : null, width: v.videoWidth}); }
      if (v.readyState >= 2) return done();
      v.addEventListener("loadeddata", done); v.addEventListener("error", done, true);
      var sources = v.querySelectorAll("source");
      if (sources.length) sources[sources.length - 1].addEventListener("error", done);
      v.load();
    });
  }
  window.addEventListener("load", function () {
    var images = Array.prototype.map.call(document.images, function (img) {
      return {src: img.currentSrc || img.src, naturalWidth: img.naturalWidth};
    });
    Promise.all(Array.prototype.map.call(document.querySelectorAll("video"), videoReady)).then(function (videos) {
      var pre = document.createElement("pre");
      pre.id = "probe-result";
      pre.textContent = JSON.stringify({images: images, videos: videos, errors: errors});
      document.body.appendChild(pre);
    });
  });
})();
"""
RESULT = re.compile(r'<pre id="probe-result">(.*?)</pre>', re.S)
CONSOLE_ERROR = re.compile(r"CONSOLE.*(Uncaught|Error|error)")


def find_chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(browser: str, args: list[str], profile: str, timeout: float = 60) -> tuple[str, str]:
    """Runs headless Chromium with `args`; returns (stdout, stderr). Its whole process group is killed
    at the end, so no renderer outlives the call, and after `timeout` seconds at the latest."""
    command = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--mute-audio",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise AssertionError(f"chromium did not finish within {timeout:.0f} s: {' '.join(args)}") from None
    _kill_group(proc.pid)
    return out, err


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def probe_page(browser: str, page: str, profile: str) -> dict:
    """Loads a copy of `page` (next to it, so relative paths hold) with the probe script; returns
    {"images": [...], "videos": [...], "errors": [...], "console": [stderr console error lines]}."""
    probe = os.path.join(os.path.dirname(page), "probe-" + os.path.basename(page))
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    with open(probe, "w", encoding="utf-8") as handle:
        handle.write(text.replace("</head>", f"<script>{PROBE_SCRIPT}</script></head>", 1))
    try:
        dom, log = run_chromium(browser, ["--virtual-time-budget=10000", "--dump-dom", f"file://{probe}"], profile)
    finally:
        os.remove(probe)
    found = RESULT.search(dom)
    assert found, f"the probe wrote no result; chromium said: {log[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    result["console"] = [line for line in log.splitlines() if CONSOLE_ERROR.search(line)]
    return result


def screenshot(browser: str, page: str, out_png: str, profile: str, size: str = "1280,2000") -> str:
    run_chromium(browser, ["--hide-scrollbars", f"--window-size={size}", "--virtual-time-budget=5000",
                           f"--screenshot={out_png}", f"file://{page}"], profile)
    assert os.path.getsize(out_png) > 10_000, f"{out_png}: the screenshot is (nearly) empty"
    return out_png
