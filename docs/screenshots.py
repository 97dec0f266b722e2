"""Screenshots of both dashboards for docs/operations.md, as a user sees them after `make demo`.

Starts `orchestrator ui RECIPE`, opens the two addresses it prints in a headless Chromium
(the system's: `apt-get install chromium`; driven by Playwright, `pip install -e
'.[browser]'`, nothing downloaded), waits for the recipe's run on each page, and writes
docs/img/mlflow.png, docs/img/prefect.png and docs/img/prefect-run.png (the newest flow
run's page). Then stops the command (Ctrl-C).

    make demo
    .venv/bin/python docs/screenshots.py [recipes/digits.yaml] [--chromium PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1400, "height": 860}


def start_ui(recipe: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`orchestrator ui RECIPE`, and the addresses it printed, by dashboard."""
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", str(recipe)],
                               cwd=ROOT, text=True, stdout=subprocess.PIPE)
    assert process.stdout is not None
    urls: dict[str, str] = {}
    for line in process.stdout:
        print(line, end="")
        if line.startswith(("MLflow", "Prefect")):
            urls[line.split()[0]] = line.split()[1]
        if line.startswith("Ctrl-C"):
            return process, urls
    sys.exit(f"`orchestrator ui` exited ({process.wait()}) before printing its addresses")


def newest_flow_run(prefect_url: str, recipe: str) -> dict[str, Any]:
    """The newest flow run of `recipe` (by its name, or its flow's), from Prefect's API:
    the database may hold other projects' runs too."""
    api = prefect_url.removesuffix("runs") + "api"

    def call(path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{api}{path}", method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"},
            data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    for run in call("/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 200}):
        if recipe in run["name"] or recipe in call(f"/flows/{run['flow_id']}")["name"]:
            return dict(run)
    sys.exit(f"Prefect has no flow run of {recipe}: run `make demo` first")


def shoot_mlflow(browser: Any, url: str, out: Path) -> None:
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(url)
    cell = page.locator('[role="gridcell"]')
    cell.first.wait_for(timeout=120_000)
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    if close.count():  # the assistant panel MLflow opens on a first visit
        close.first.click()
    expand = page.locator('[role="gridcell"] button').first  # the parent run's nested runs
    if expand.count():
        expand.click()
    page.wait_for_timeout(1500)  # let the grid settle after the clicks
    page.screenshot(path=str(out))


def shoot_prefect(browser: Any, url: str, recipe: str, out: Path, out_run: Path) -> None:
    """The runs page, and the recipe's newest flow run's own page (its task runs)."""
    run = newest_flow_run(url, recipe)
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(url)
    page.get_by_text(run["name"], exact=True).first.wait_for(timeout=120_000)
    page.wait_for_timeout(1000)  # the chart's transition
    page.screenshot(path=str(out))
    page.goto(f"{url}/flow-run/{run['id']}")
    page.get_by_text(run["name"], exact=True).first.wait_for(timeout=120_000)
    page.wait_for_timeout(2000)  # the timeline draws itself
    page.screenshot(path=str(out_run))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", type=Path, default=ROOT / "recipes/digits.yaml")
    parser.add_argument("--chromium", default=shutil.which("chromium")
                        or shutil.which("chromium-browser"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    if not args.chromium:
        sys.exit("no Chromium: apt-get install chromium (or --chromium PATH)")
    from playwright.sync_api import sync_playwright

    from orchestrator.cli.ui import recipe_name

    args.out.mkdir(parents=True, exist_ok=True)
    process, urls = start_ui(args.recipe)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, headless=True)
            shoot_mlflow(browser, urls["MLflow"], args.out / "mlflow.png")
            shoot_prefect(browser, urls["Prefect"], recipe_name(args.recipe),
                          args.out / "prefect.png",
                          args.out / "prefect-run.png")
            browser.close()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    print(f"wrote mlflow.png, prefect.png and prefect-run.png in {args.out}")


if __name__ == "__main__":
    main()
