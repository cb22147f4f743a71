"""The course in a real browser, for the browser test (``make test-browser``) and the notebook speed
benchmark (``benchmarks/bench_notebook.py``): JupyterLab serving a copy of the notebooks on a free
loopback port with a token, and Debian's chromium driven by playwright (no browser is downloaded).
Both are test and benchmark tools: the course itself never needs them.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

CHROMIUM = os.environ.get("LLMLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class LabUnavailable(RuntimeError):
    """playwright, chromium or JupyterLab is missing (the message says which, and how to get it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """``with Lab(folder, checkout) as lab``: JupyterLab on a copy of ``checkout``'s notebooks in
    ``folder`` (so autosave never touches the committed files; ``source``: a folder of other executed
    notebooks to serve instead, e.g. fresh runs) and a headless chromium; ``lab`` is a dict with the
    server's ``base`` URL, ``token``, the playwright ``browser`` and the ``served`` folder."""

    def __init__(self, folder: Path, checkout: Path, source: str | Path | None = None):
        self.served, self.root = Path(folder), Path(checkout)
        self.source = Path(source) if source else self.root / "notebooks"

    def __enter__(self) -> dict:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            raise LabUnavailable("playwright is not installed (make browser-deps)") from None
        if not Path(CHROMIUM).exists():
            raise LabUnavailable(f"no chromium at {CHROMIUM} (make browser-deps installs Debian's chromium)")
        if shutil.which("jupyter", path=str(Path(sys.executable).parent)) is None and shutil.which("jupyter") is None:
            raise LabUnavailable("JupyterLab is not installed (make setup)")
        served = self.served
        (served / "notebooks").mkdir(parents=True, exist_ok=True)
        for p in (self.root / "notebooks").glob("*.ipynb"):
            if (self.source / p.name).exists():
                p = self.source / p.name
            shutil.copy2(p, served / "notebooks" / p.name)
        if not (served / "llmlab").exists():      # a checkout's layout; the notebooks' data come through the package
            (served / "llmlab").symlink_to(self.root / "llmlab")
        port, token = _free_port(), uuid.uuid4().hex
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")])),
                   JUPYTER_CONFIG_DIR=str(served / ".jupyter-config"))
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--ServerApp.token={token}", f"--ServerApp.root_dir={served}",
               f"--LabApp.workspaces_dir={served / '.workspaces'}", f"--LabApp.user_settings_dir={served / '.settings'}"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        news = served / ".settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True, exist_ok=True)
        news.write_text('{"fetchNews": "false", "checkForUpdates": false}')     # no pop-up over the screenshots
        self._log = open(served / "lab.log", "w")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=served)
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if self._proc.poll() is not None:
                    self._stop()
                    raise RuntimeError("JupyterLab exited: " + (served / "lab.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        else:
            self._stop()
            raise RuntimeError("JupyterLab did not start in 120 s: " + (served / "lab.log").read_text()[-2000:])
        from playwright.sync_api import sync_playwright
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        return {"base": base, "token": token, "browser": self._browser, "served": served}

    def _stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()

    def __exit__(self, *exc) -> None:
        self._browser.close()
        self._pw.stop()
        self._stop()


def wait_idle(page, timeout: float, polls: int = 3) -> None:
    """Idle = the execution indicator says idle and no cell shows [*], three polls in a row."""
    t_end, calm = time.time() + timeout, 0
    while time.time() < t_end:
        idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() > 0
        busy = page.locator(".jp-InputPrompt:has-text('[*]')").count() > 0
        calm = calm + 1 if idle and not busy else 0
        if calm >= polls:
            return
        time.sleep(1.0)
    raise AssertionError(f"the kernel was still busy after {timeout:.0f} s")


def open_notebook(lab: dict, name: str, viewport=(1400, 1000), errors: list | None = None):
    """A new page with notebook ``name`` open in a fresh workspace, its kernel idle; the page's
    JavaScript errors from the start on are appended to ``errors``."""
    page = lab["browser"].new_page(viewport={"width": viewport[0], "height": viewport[1]})
    if errors is not None:
        page.on("pageerror", lambda e: errors.append(str(e)))
    ws = f"t{uuid.uuid4().hex[:8]}"
    page.goto(f"{lab['base']}/lab/workspaces/{ws}/tree/notebooks/{name}.ipynb?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    wait_idle(page, 180)
    return page


def run_all(page, timeout: float) -> None:
    """Run > Run All Cells, as a learner does, and wait until the kernel is idle again."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    time.sleep(3)
    wait_idle(page, timeout)
