"""The page in a real browser: Debian's chromium driven by Playwright, never a downloaded one.

Called by tests/ui_browser.rs with one JSON argument (the proxy's URL, the keys, the session,
what the page must show). Talks to the test on stdout/stdin when it needs a new request sent
while a session page is open ("NEED live" -> the test sends it and answers "sent"). Prints
"RESULT <json>" with what it measured; any failed check is an AssertionError (exit status 1).
"""

import json
import sys

from playwright.sync_api import sync_playwright

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def ask(step):
    print(f"NEED {step}", flush=True)
    answer = sys.stdin.readline().strip()
    assert answer == "sent", f"the test answered {answer!r} to {step}"


class Watch:
    """Every dialog and console error a page shows: content must never run a script."""

    def __init__(self, page):
        self.dialogs = []
        self.errors = []
        self.expect_confirm = False
        # Pages this key must not see answer 404, which the console reports.
        self.expect_404 = False
        page.on("dialog", self.dialog)
        page.on("console", self.console)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def console(self, m):
        if m.type != "error":
            return
        if self.expect_404 and "status of 404" in m.text:
            return
        self.errors.append(f"{m.text} ({m.location.get('url')})")

    def dialog(self, d):
        self.dialogs.append((d.type, d.message))
        if d.type == "confirm" and self.expect_confirm:
            d.accept()
        else:
            d.dismiss()

    def check(self):
        unexpected = [d for d in self.dialogs if d[0] != "confirm"]
        assert not unexpected, f"a dialog opened: {unexpected}"
        assert not self.errors, f"console errors: {self.errors}"


def login(page, base, key):
    page.goto(base + "/ui/")
    assert page.url.endswith("/ui/login"), page.url
    page.fill("#key", key)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.url == base + "/ui/", f"{page.url}: {page.content()}"



def main():
    cfg = json.loads(sys.argv[1])
    base = cfg["base"]
    result = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        page = ctx.new_page()
        watch = Watch(page)

        # Log in with the key; the session is listed with its figures.
        login(page, base, cfg["key"])
        row = page.locator("tr.session", has_text=cfg["session"])
        assert row.count() == 1, page.content()
        assert row.locator("td.turns").inner_text() == str(cfg["turns"]), row.inner_text()
        assert row.locator("td.sent").inner_text() == f"{cfg['tokens_sent']:,}", row.inner_text()
        assert row.locator("td.forwarded").inner_text() == f"{cfg['tokens_forwarded']:,}", row.inner_text()
        assert row.locator("td.reloads").inner_text() == "1", row.inner_text()
        # Costs in dollars, with and without the proxy, as the replay's report prices them.
        assert row.locator("td.cost-without").inner_text() == cfg["cost_without"], row.inner_text()
        assert row.locator("td.cost-with").inner_text() == cfg["cost_with"], row.inner_text()
        # In a narrow window (1024 px) nothing runs off the page: the list scrolls in its box.
        page.set_viewport_size({"width": 1024, "height": 900})
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1], f"the page is wider than the window: {widths}"
        page.set_viewport_size({"width": 1400, "height": 900})

        # The filters: by model, then by time (the older session is of another model, last
        # active three hours ago; the 500-turn one hours ago too).
        def listed():
            return {r.locator("a").first.inner_text() for r in page.locator("tr.session").all()}

        everything = listed()
        assert {cfg["session"], cfg["older_session"]} <= everything, everything
        page.select_option("#model", "gpt-4o-mini")
        with page.expect_navigation():
            page.click("form.filter button")
        assert listed() == {cfg["older_session"]}, listed()
        page.select_option("#model", "")
        page.select_option("#since", "1")
        with page.expect_navigation():
            page.click("form.filter button")
        recent = listed()
        assert cfg["session"] in recent and cfg["older_session"] not in recent, recent
        page.goto(base + "/ui/")
        row = page.locator("tr.session", has_text=cfg["session"])

        # The session: its timeline with a reload round, and the chart.
        row.locator("a").first.click()
        page.wait_for_selector("#live")
        assert page.locator("figure.chart svg polyline").count() == 4
        assert "dollars" in page.locator("#chart-cost figcaption").inner_text()
        fig_cost = page.locator("#fig-cost").inner_text()
        assert fig_cost == f"{cfg['cost_without']} / {cfg['cost_with']}", fig_cost
        reload_cell = page.locator("td.reloads details").first
        reload_cell.locator("summary").click()
        assert "context_read" in reload_cell.inner_text(), reload_cell.inner_text()
        assert cfg["reload_text"] in reload_cell.inner_text(), reload_cell.inner_text()

        # A new request appears live, without a reload of the page.
        turns_before = page.locator("tr.turn").count()
        marker = page.evaluate("() => { window.__same_page = 42; return 42; }")
        ask("live")
        page.wait_for_selector(f"#turn-{turns_before + 1}", timeout=15000)
        assert page.evaluate("() => window.__same_page") == marker, "the page was reloaded"
        result["live_turns"] = page.locator("tr.turn").count()

        # Side by side: the marker where the content was, its reference a link to the original.
        page.locator(f"#turn-1 a", has_text="side by side").click()
        page.wait_for_selector("table.side-by-side")
        mark = page.locator("td.proxy mark.marker").first
        assert mark.count() == 1, page.content()
        # The hostile tool result is shown as text, on both sides.
        client_text = page.locator("table.side-by-side td").first.inner_text()
        body_text = page.locator("table.side-by-side").inner_text()
        for needle in cfg["hostile_visible"]:
            assert needle in body_text, f"{needle!r} not shown as text"
        assert page.locator("table.side-by-side script").count() == 0
        assert page.locator("table.side-by-side img").count() == 0
        assert page.locator("a[href^='javascript:']").count() == 0
        assert page.locator("a.ref", has_text=cfg["fake_ref"]).count() == 0, "fake marker linked"
        # The proxy's hidden rounds where they happened: after the last message the model
        # received (the table's last row), on the model's side, with the call and its answer.
        last_row = page.locator("table.side-by-side tbody tr").last
        assert last_row.get_attribute("class") == "hidden-rounds", last_row.inner_html()[:500]
        hidden = last_row.locator("td.proxy").inner_text()
        assert "context_read" in hidden and cfg["reload_text"] in hidden, hidden
        assert "context_read" not in last_row.locator("td.client").inner_text()
        link = mark.locator("a.ref").first
        assert link.inner_text() == cfg["ref"], link.inner_text()
        link.click()
        page.wait_for_selector("ol.stored")
        assert cfg["ref_line"] in page.locator("ol.stored").inner_text()
        assert page.locator("ol.stored li").count() == 500, "a page of lines, not the whole"
        page.click("a.next")
        page.wait_for_selector("ol.stored")
        assert page.locator("ol.stored").get_attribute("start") == "501"
        watch.check()

        # A Responses API request, item by item: the route named, the call's output replaced
        # by its marker, the reference a link, the hostile output shown as text.
        if cfg.get("responses_session"):
            page.goto(base + "/ui/session?s=" + cfg["responses_session"])
            page.locator("#turn-1 a", has_text="side by side").click()
            page.wait_for_selector("table.side-by-side")
            assert page.locator("#route").inner_text() == "/v1/responses", page.locator("#route").inner_text()
            mark = page.locator("td.proxy mark.marker").first
            assert mark.count() == 1, page.content()
            assert mark.locator("a.ref").first.inner_text() == cfg["ref"]
            body_text = page.locator("table.side-by-side").inner_text()
            assert "read_file" in body_text and "call_a" in body_text, body_text[:2000]
            for needle in cfg["hostile_visible"]:
                assert needle in body_text, f"{needle!r} not shown as text"
            assert page.locator("table.side-by-side script").count() == 0
            assert page.locator("table.side-by-side img").count() == 0
            watch.check()

        # An Anthropic Messages request, block by block: the route named, the tool_result's
        # content replaced by its marker (highlighted), the reference a link that opens the
        # original, the hostile content shown as text.
        if cfg.get("messages_session"):
            page.goto(base + "/ui/session?s=" + cfg["messages_session"])
            page.locator("#turn-1 a", has_text="side by side").click()
            page.wait_for_selector("table.side-by-side")
            assert page.locator("#route").inner_text() == "/v1/messages", page.locator("#route").inner_text()
            assert "You are a coding agent." in page.locator("table.side-by-side").inner_text()
            mark = page.locator("td.proxy mark.marker").first
            assert mark.count() == 1, page.content()
            background = mark.evaluate("e => getComputedStyle(e).backgroundColor")
            assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
            body_text = page.locator("table.side-by-side").inner_text()
            assert "toolu_a" in body_text and "read_file" in body_text, body_text[:2000]
            for needle in cfg["hostile_visible"]:
                assert needle in body_text, f"{needle!r} not shown as text"
            assert page.locator("table.side-by-side script").count() == 0
            assert page.locator("table.side-by-side img").count() == 0
            link = mark.locator("a.ref").first
            assert link.inner_text() == cfg["ref"], link.inner_text()
            link.click()
            page.wait_for_selector("ol.stored")
            assert cfg["ref_line"] in page.locator("ol.stored").inner_text()
            watch.check()

        # A 100 000-line tool result opens paged, never whole: the side-by-side view holds the
        # start of it, the message and the stored original a page of lines each, and the next
        # page is a link away.
        if cfg.get("huge_session"):
            page.goto(base + "/ui/session?s=" + cfg["huge_session"])
            page.locator("#turn-1 a", has_text="side by side").click()
            page.wait_for_selector("table.side-by-side")
            whole = page.evaluate("() => document.documentElement.outerHTML.length")
            assert whole < 200_000, f"the side-by-side view holds {whole} bytes"
            text = page.locator("table.side-by-side").inner_text()
            assert "log line 60: ok" in text and "log line 61: ok" not in text
            mark = page.locator("td.proxy mark.marker").first
            link = mark.locator("a.ref").first
            assert link.inner_text() == cfg["huge_ref"], link.inner_text()
            link.click()
            page.wait_for_selector("ol.stored")
            assert page.locator("ol.stored li").count() == 500
            stored = page.locator("ol.stored").inner_text()
            assert "log line 1: ok" in stored and "log line 500: ok" in stored
            assert "log line 501: ok" not in page.content()
            whole = page.evaluate("() => document.documentElement.outerHTML.length")
            assert whole < 200_000, f"a page of the original holds {whole} bytes"
            with page.expect_navigation():
                page.click("a.next")
            assert page.locator("ol.stored").get_attribute("start") == "501"
            assert page.locator("ol.stored li").count() == 500
            stored = page.locator("ol.stored").inner_text()
            assert "log line 501: ok" in stored and "log line 1000: ok" in stored
            assert "log line 1001: ok" not in page.content()
            watch.check()

        # Another key sees nothing of it.
        other_ctx = browser.new_context()
        other = other_ctx.new_page()
        other_watch = Watch(other)
        other_watch.expect_404 = True
        login(other, base, cfg["other_key"])
        assert cfg["session"] not in other.content()
        # Not even a count: the other key's list has no row at all.
        assert other.locator("tr.session").count() == 0, other.content()
        resp = other.goto(base + "/ui/session?s=" + cfg["session"])
        assert resp.status == 404, resp.status
        assert "turn-1" not in other.content()
        resp = other.goto(base + "/ui/ref?r=" + cfg["ref"])
        assert resp.status == 404, resp.status
        assert cfg["ref_line"] not in other.content()
        other_watch.check()
        other_ctx.close()

        # A 500-turn session opens fast: time to first contentful paint.
        if cfg.get("big_session"):
            page.goto(base + "/ui/session?s=" + cfg["big_session"])
            page.wait_for_selector("#turn-500")
            # The paint entry is recorded after the element is in the DOM: wait for it.
            page.wait_for_function(
                "() => performance.getEntriesByType('paint')"
                ".some(e => e.name === 'first-contentful-paint')"
            )
            fcp = page.evaluate(
                "() => performance.getEntriesByType('paint')"
                ".filter(e => e.name === 'first-contentful-paint').map(e => e.startTime)[0]"
            )
            nav = page.evaluate(
                "() => performance.getEntriesByType('navigation')[0].responseEnd"
            )
            result["big_fcp_ms"] = fcp
            # A page of the timeline at a time: the newest 100, then older ones.
            assert page.locator("tr.turn").count() == 100, page.locator("tr.turn").count()
            assert page.locator("#turn-400").count() == 0
            with page.expect_navigation():
                page.click("a.older")
            assert page.locator("#turn-400").count() == 1 and page.locator("#turn-500").count() == 0
            assert page.locator("tr.turn").count() == 100
            page.goto(base + "/ui/session?s=" + cfg["big_session"])
            result["big_response_end_ms"] = nav

        # Erasure from the page removes the session.
        page.goto(base + "/ui/session?s=" + cfg["session"])
        watch.expect_confirm = True
        page.click("form.erase button")
        page.wait_for_url(base + "/ui/")
        assert page.locator("tr.session", has_text=cfg["session"]).count() == 0
        watch.check()
        watch.expect_404 = True
        resp = page.goto(base + "/ui/session?s=" + cfg["session"])
        assert resp.status == 404
        watch.check()
        result["dialogs"] = watch.dialogs
        browser.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
