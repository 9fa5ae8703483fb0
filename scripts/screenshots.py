"""The README's screenshots of the page (`/ui/`), taken as a user would see it.

Starts the mock upstream (in reader mode) and a compacting proxy with `[ui]` on, both from the
`context-proxy` binary given, sends a scripted coding-agent session through the proxy with the
official OpenAI Python SDK (large file reads, compacted as the conversation grows; a last
question the mock answers by reading a stored original back with the proxy's tools, a reload
round), then opens the page in Debian's chromium through Playwright (`executable_path`: nothing
downloads a browser) and saves the three views, 1200 px wide:

    docs/img/ui-sessions.png  the session list
    docs/img/ui-session.png   the session: its figures, its chart and its timeline
    docs/img/ui-request.png   one request side by side, the compacted result's marker

Usage (the venv is `scripts/test --install`'s, with `openai` and `playwright`):

    cargo build --release
    .venv/bin/python scripts/screenshots.py --bin target/release/context-proxy --out docs/img
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from openai import OpenAI
from playwright.sync_api import sync_playwright

KEY = "sk-alice-screenshots"
SESSION = "fix-the-parser"
WIDTH = 1200
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, child):
    deadline = time.time() + 30
    while time.time() < deadline:
        if child.poll() is not None:
            sys.exit(f"{url}: the process exited with {child.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{url} did not answer in 30 s")


def config(dir, mock_port, proxy_port):
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
[server]
listen = "127.0.0.1:{proxy_port}"

[upstream]
base_url = "http://127.0.0.1:{mock_port}/v1"
api_key_env = "SCREENSHOTS_UPSTREAM_KEY"

[context]
mode = "auto"
max_context_tokens = 12000
keep_recent_messages = 4
tool_result_max_tokens = 3000

[store]
backend = "fs"
path = "{dir}/data"

[ui]
enabled = true
poll_ms = 1000

[[keys]]
name = "alice"
sha256 = "{sha}"
"""


def source_file(name, lines):
    """A file as `cat` shows it: numbered lines of plausible code."""
    return "\n".join(
        f"{i + 1:5}  fn {name}_{i}(input: &str) -> Result<Token, Error> {{ parse(input, {i}) }}"
        for i in range(lines)
    )


def session(client):
    """A coding agent: the task, then turns of a tool call and its (large) result, each
    request the whole conversation so far, as an agent sends it."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the repository.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
    ]
    messages = [
        {"role": "system", "content": "You are a coding agent. Use read_file to read code."},
        {"role": "user", "content": "Task: the parser drops the last token of a line. Fix it."},
    ]
    files = ["src/lexer.rs", "src/parse.rs", "src/token.rs", "src/span.rs", "src/error.rs",
             "src/ast.rs", "src/eval.rs", "tests/parse.rs"]
    for i, path in enumerate(files):
        call_id = f"call_{i}"
        messages.append({
            "role": "assistant",
            "content": None,
            "tool_calls": [{
                "id": call_id,
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
            }],
        })
        text = source_file(path.split("/")[-1].split(".")[0], 160)
        if i == 0:
            # A line a later question needs, and content a page must show as text.
            text = "NEEDLE lexer_bug=off-by-one in next_token\n" + text
            text += "\n// <script>alert('x')</script> <img src=x onerror=alert(1)>"
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or "ok"})
        messages.append({"role": "user", "content": f"Go on: step {i + 2}."})
    # The needle is in the first result, long compacted: the mock reads it back.
    messages.append({"role": "user", "content": "Recall the needles: lexer_bug"})
    reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
    return reply.choices[0].message.content


def short_session(base):
    """Another session the list shows: a few questions to a smaller model."""
    client = OpenAI(base_url=base + "/v1", api_key=KEY,
                    default_headers={"x-context-session": "release-notes"})
    messages = [{"role": "user", "content": "Summarize the changelog of 0.9 in three lines."}]
    for question in ["Shorter.", "Now as one sentence."]:
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": question})
    client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def shoot(base, out):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_context(viewport={"width": WIDTH, "height": 820}).new_page()
        errors = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("dialog", lambda d: (errors.append(f"dialog {d.message}"), d.dismiss()))
        page.goto(base + "/ui/")
        page.fill("#key", KEY)
        with page.expect_navigation():
            page.click("button[type=submit]")
        page.wait_for_selector("tr.session")
        bottom = page.evaluate("() => document.querySelector('main').getBoundingClientRect().bottom")
        page.screenshot(path=os.path.join(out, "ui-sessions.png"),
                        clip={"x": 0, "y": 0, "width": WIDTH, "height": min(820, bottom + 16)})
        page.locator("tr.session a", has_text=SESSION).click()
        page.wait_for_selector("figure.chart svg polyline")
        page.screenshot(path=os.path.join(out, "ui-session.png"))
        # The newest request that compacted something, side by side, scrolled to its marker.
        row = page.locator("tr.turn", has_text="compacted").first
        row.locator("a", has_text="side by side").click()
        page.wait_for_selector("table.side-by-side")
        page.locator("td.proxy mark.marker").first.scroll_into_view_if_needed()
        page.evaluate("() => window.scrollBy(0, -120)")
        page.screenshot(path=os.path.join(out, "ui-request.png"))
        browser.close()
        if errors:
            sys.exit(f"the page reported errors: {errors}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/context-proxy")
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    children = []
    with tempfile.TemporaryDirectory() as dir:
        try:
            mock_port, proxy_port = free_port(), free_port()
            children.append(subprocess.Popen(
                [args.bin, "mock-upstream", "--reader", "--listen", f"127.0.0.1:{mock_port}"],
                stdout=subprocess.DEVNULL))
            wait_healthy(f"http://127.0.0.1:{mock_port}/v1/models", children[0])
            path = os.path.join(dir, "config.toml")
            with open(path, "w") as f:
                f.write(config(dir, mock_port, proxy_port))
            env = dict(os.environ, SCREENSHOTS_UPSTREAM_KEY="sk-upstream", RUST_LOG="warn")
            children.append(subprocess.Popen([args.bin, "--config", path], env=env,
                                             stdout=subprocess.DEVNULL))
            base = f"http://127.0.0.1:{proxy_port}"
            wait_healthy(base + "/healthz", children[1])
            client = OpenAI(base_url=base + "/v1", api_key=KEY,
                            default_headers={"x-context-session": SESSION})
            short_session(base)
            answer = session(client)
            print(f"the session's last answer: {answer!r}")
            shoot(base, args.out)
            print(f"saved the three views in {args.out}")
        finally:
            for child in reversed(children):
                child.terminate()
                child.wait()


if __name__ == "__main__":
    main()
