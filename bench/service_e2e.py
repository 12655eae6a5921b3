"""The service's end-to-end run, printed: five jobs of three families through
``arena serve --local-slots 4`` (the workload of tests/test_service_e2e.py), then the
per-job report (launches, moves, steps lost, seconds queued and running, plans) and each
job's largest loss deviation from the same job trained uninterrupted in one process.

    python bench/service_e2e.py [--crash] [--screenshot docs/img/status-page.png] [--json]

``--crash``: the crash test's schedule (``scenario.CRASH_FAULTS``: SIGKILL after a launch
intent, mid-move, after a recorded decision, at a random moment; restart each time). ``--screenshot``: a headless
Chromium screenshot of the status page taken while jobs run, the first listed job's
detail panel open (Debian's chromium).
Progress on stderr; the report (or JSON) on stdout.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path


def _screenshot(url: str, out: Path, after_s: float) -> None:
    from playwright.sync_api import sync_playwright
    time.sleep(after_s)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                          "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/", timeout=60_000)
        page.wait_for_selector("body[data-loaded='1']", timeout=60_000)
        time.sleep(2.5)                       # a refresh with the loss curves drawn
        row = page.locator("#jobs tbody tr[data-job]").first
        row.click()                           # the job detail panel, under the lists
        page.wait_for_selector("#job-detail:not([hidden])", timeout=30_000)
        time.sleep(2.5)
        page.screenshot(path=str(out), full_page=True)
        browser.close()
    print(f"screenshot: {out}", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crash", action="store_true", help="kill and restart the service (the crash test's schedule)")
    p.add_argument("--screenshot", default=None, metavar="PNG", help="status page screenshot while jobs run")
    p.add_argument("--screenshot-after", type=float, default=30.0, metavar="S")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.screenshot and not shutil.which("chromium"):
        print("no chromium (apt-get install chromium)", file=sys.stderr)
        return 2

    from engine.service.scenario import (
        CRASH_FAULTS,
        CRASH_RANDOM_WINDOW_S,
        CRASH_REPEATS,
        demo_jobs,
        demo_serve_args,
        format_moves,
        format_report,
        format_shadow,
        free_port,
        job_report,
        loss_deviation,
        run_scenario,
    )
    with tempfile.TemporaryDirectory(prefix="arena-service-e2e-") as tmp:
        tmp_p, port = Path(tmp), free_port()
        url = f"http://127.0.0.1:{port}"
        shot = None
        if a.screenshot:
            shot = threading.Thread(target=_screenshot, args=(url, Path(a.screenshot), a.screenshot_after))
            shot.start()
        res = run_scenario(demo_serve_args(tmp_p, port), url, tmp_p / "serve.log", demo_jobs(),
                           faults=CRASH_FAULTS if a.crash else (), seed=7, random_window_s=CRASH_RANDOM_WINDOW_S,
                           repeats=CRASH_REPEATS, timeout_s=1200,
                           progress=lambda m: print(m, file=sys.stderr, flush=True))
        if shot is not None:
            shot.join()
        rows = job_report(str(tmp_p / "state.db"), str(tmp_p / "work"))
        dev = loss_deviation(str(tmp_p / "state.db"), str(tmp_p / "work"), res.submitted, res.ids)
        shadow = format_shadow(str(tmp_p / "state.db"))
    if a.json:
        print(json.dumps({"jobs": rows, "loss_deviation": dev, "kills": res.kills, "unfired": res.unfired,
                          "starts": res.starts, "wall_s": res.wall_s, "shadow": shadow}, indent=1))
    else:
        print(format_report(rows))
        print(format_moves(rows))
        if shadow:
            print(shadow)
        print("largest |loss - uninterrupted| per job: " + ", ".join(f"{k} {v:.1e}" for k, v in dev.items()))
        print(f"wall {res.wall_s:.0f} s, service starts {res.starts}, kills {res.kills or 'none'}"
              + (f", not reached: {res.unfired}" if res.unfired else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
