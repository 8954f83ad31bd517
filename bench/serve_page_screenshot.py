"""Screenshot of the `multibranch serve` page for the docs: a translation with its n-best list and
the attention heat map of the best one (or, for a classifier, the texts' labels with their
probabilities), in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium with the
system driver; nothing is downloaded).

    python bench/serve_page_screenshot.py --ckpt runs/m30k/transformer/best.pt \
        [--text "..."] [--kind cross] [--layer L] [--unit branch:0|head:H] [--out docs/images/serve-page.png]
    python bench/serve_page_screenshot.py --ckpt runs/trec6/std/best.pt --text "..." --out docs/images/serve-classify.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serve_load import free_port  # noqa: E402

TEXT = "Two young children are playing with a red ball in the park.\nA man in a blue shirt is riding a bicycle."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--text", default=TEXT, help="source lines (\\n-separated)")
    parser.add_argument("--kind", default="cross", choices=["cross", "encoder_self", "decoder_self"])
    parser.add_argument("--layer", type=int, help="unset: the page's default (the last layer)")
    parser.add_argument("--unit", default="branch:0", help="head:H or branch:B (branch:0 = mean of all heads)")
    parser.add_argument("--out", default="docs/images/serve-page.png")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=600, help="at least; the whole page is taken")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        sys.exit("needs chromium and chromedriver (apt-get install chromium chromium-driver)")

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "multibranch", "serve", "--ckpt", args.ckpt, "--port", str(port),
                               "--device", "cpu"], stderr=subprocess.DEVNULL)
    os.environ["SE_OFFLINE"] = "true"
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     f"--window-size={args.width},{args.height}"):
        options.add_argument(argument)
    driver = None
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        wait = WebDriverWait(driver, 60)
        driver.get(url + "/")
        wait.until(lambda d: "engine" in d.find_element(By.ID, "model-info").text)
        driver.find_element(By.ID, "source").send_keys(args.text)
        classifier = driver.find_element(By.ID, "translate").text == "Classify"  # the page's classifier layout
        driver.find_element(By.ID, "translate").click()
        if classifier:
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sentences .label"))
        else:
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sentences .hyp"))
            driver.find_element(By.CSS_SELECTOR, "#sentences .hyp").click()
            Select(driver.find_element(By.ID, "kind")).select_by_value(args.kind)
            if args.layer is not None:
                Select(driver.find_element(By.ID, "layer")).select_by_value(str(args.layer))
            Select(driver.find_element(By.ID, "unit")).select_by_value(args.unit)
            wait.until(lambda d: d.find_element(By.ID, "attention-caption").text.startswith(("encoder.", "decoder.")))
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {  # the whole page in the viewport
            "width": args.width, "height": max(args.height, height), "deviceScaleFactor": 1, "mobile": False})
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.png")
        driver.save_screenshot(str(tmp))
        os.replace(tmp, out)
        print(f"{out}: {out.stat().st_size / 1024:.0f} KB")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
