"""The playground page in a real browser (headless Chromium, driven by Playwright) against
the real back end: `vllm-x86 playground` with its own daemon folder, started once for
the module, serving the default model.

What a person does is what each test does: load the default model from the Models view
and see the status reach "ready", chat and see the answer grow token by token, stop a
long answer, switch to INT8, ask for JSON that fits a schema and see the verdict, give a
folder the playground must refuse and see why while the loaded model keeps answering,
and check that the page talks to no host but the playground's own.

Chromium is Debian's package (the Makefile's test setup installs it:
scripts/install_chromium.sh); tests/e2e/playground_browser.py launches it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import clean_env
from tests.e2e.playground_browser import INSTALL_HINT, Playground, chromium_path

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (requirements-dev.txt)"
)
expect = sync_api.expect

pytestmark = pytest.mark.slow

LOAD_MS = 600_000  # a first load starts the daemon (imports vLLM) and the model server
ANSWER_MS = 180_000
STATS = re.compile(r"TTFT \d+\.\d\d s · [\d.]+ tok/s · \d+ prompt \+ \d+ completion tokens")


@pytest.fixture(scope="module")
def playground(default_model, tmp_path_factory):
    pg = Playground(tmp_path_factory.mktemp("playground"), clean_env())
    pg.default = default_model.name
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="module")
def browser():
    if chromium_path() is None:
        pytest.skip(
            f"no Chromium on this machine and the test setup could not install it: {INSTALL_HINT}"
        )
    from tests.e2e.playground_browser import launch

    with sync_api.sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, playground):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg_page = context.new_page()
    errors: list[str] = []
    pg_page.on("pageerror", lambda e: errors.append(str(e)))
    pg_page.goto(playground.base + "/")
    yield pg_page
    context.close()
    assert not errors, f"the page raised: {errors}"


def view(page, name):
    return page.locator(f"#view-{name}")


def status(playground) -> dict:
    r = playground.api("status")
    assert r.status_code == 200, r.text
    return r.json()


def ensure_ready(page, playground, precision="bf16"):
    """The default model loaded at `precision`, through the page's own Load button."""
    st = status(playground)
    if (
        st["state"] == "ready"
        and st["precision"] == precision
        and st["model"] == playground.default
    ):
        return st
    page.get_by_test_id("tab-models").click()
    page.get_by_test_id("precision").select_option(precision)
    row = page.locator(f'[data-testid="model-row"][data-id="{playground.default}"]')
    row.get_by_test_id("load").click()
    expect(page.get_by_test_id("status")).to_contain_text("starting", timeout=30_000)
    expect(page.get_by_test_id("status")).to_contain_text("ready", timeout=LOAD_MS)
    expect(page.get_by_test_id("status")).to_contain_text(precision)
    st = status(playground)
    assert st["state"] == "ready" and st["precision"] == precision, (st, playground.log()[-3000:])
    return st


def ask(page, prompt: str, max_tokens: int = 48):
    """Send `prompt` from the Chat view; returns the new answer's locator."""
    page.get_by_test_id("tab-chat").click()
    page.get_by_test_id("max-tokens").fill(str(max_tokens))
    before = page.get_by_test_id("answer").count()
    page.get_by_test_id("prompt").fill(prompt)
    page.get_by_test_id("send").click()
    expect(page.get_by_test_id("answer")).to_have_count(before + 1)
    return page.get_by_test_id("answer").nth(before)


# Records the answer's text length at each change until it leaves "streaming".
WATCH = """(el) => new Promise((resolve) => {
  const seen = [[performance.now(), el.textContent.length]];
  const obs = new MutationObserver(() => {
    seen.push([performance.now(), el.textContent.length]);
    if (el.dataset.state !== "streaming") { obs.disconnect(); resolve(seen); }
  });
  obs.observe(el, {childList: true, subtree: true, characterData: true, attributes: true});
  if (el.dataset.state !== "streaming") { obs.disconnect(); resolve(seen); }
})"""


def test_default_model_loads_from_the_page_and_the_answer_streams(page, playground):
    first = page.get_by_test_id("model-row").first
    expect(first).to_have_attribute("data-id", playground.default)
    expect(first).to_contain_text("default")
    expect(first.get_by_test_id("load")).to_be_visible()
    ensure_ready(page, playground)
    expect(page.get_by_test_id("header-status")).to_contain_text("ready")

    answer = ask(page, "Tell me about the sea in three sentences.", max_tokens=64)
    seen = answer.evaluate(WATCH, timeout=ANSWER_MS)
    expect(answer).to_have_attribute("data-state", "done")
    lengths = [n for _, n in seen]
    growing = sorted(set(lengths))
    assert len(growing) >= 4, f"the answer did not arrive in pieces: {seen}"
    assert lengths == sorted(lengths), f"the answer shrank while streaming: {lengths}"
    assert answer.inner_text().strip()
    stats = page.get_by_test_id("answer-stats").last
    expect(stats).to_have_text(STATS)

    page.get_by_test_id("copy-curl").click()
    snippet = page.get_by_test_id("api-snippet").inner_text()
    base = status(playground)["base_url"]
    assert base.startswith("http://127.0.0.1:") and "PORT" not in snippet, (base, snippet)
    assert f"{base}/v1/chat/completions" in snippet and "Tell me about the sea" in snippet, snippet
    assert '"stream": true' in snippet and '"max_tokens": 64' in snippet, snippet
    page.get_by_test_id("copy-python").click()
    snippet = page.get_by_test_id("api-snippet").inner_text()
    assert "from openai import OpenAI" in snippet and "max_tokens=64" in snippet, snippet


def test_stop_ends_a_long_answer(page, playground):
    st = ensure_ready(page, playground)
    budget = min(1500, (st.get("max_model_len") or 2048) - 200)
    answer = ask(
        page, "Write a very long story about a lighthouse keeper and a storm.", max_tokens=budget
    )
    expect(answer).not_to_have_text("", timeout=ANSWER_MS)
    page.get_by_test_id("stop").click()
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(page.get_by_test_id("answer-stats").last).to_contain_text("Stopped")
    expect(page.get_by_test_id("stop")).to_be_disabled()
    expect(page.get_by_test_id("send")).to_be_enabled()
    stopped_at = len(answer.inner_text())
    page.wait_for_timeout(1000)
    assert len(answer.inner_text()) == stopped_at, "text still arrived after the stop"
    # the model server no longer runs the request
    deadline_polls = 30
    for _ in range(deadline_polls):
        m = playground.api("metrics").json()
        if m.get("ok") and m.get("running") == 0:
            break
        page.wait_for_timeout(500)
    else:
        pytest.fail(f"the stopped request still runs on the model server: {m}")


def test_json_schema_answer_is_checked_valid(page, playground):
    ensure_ready(page, playground)
    page.get_by_test_id("tab-structured").click()
    page.get_by_test_id("so-mode").select_option("json_schema")
    expect(page.get_by_test_id("so-example").locator("option")).not_to_have_count(1)
    page.get_by_test_id("so-example").select_option(label="person (nested object)")
    schema = json.loads(page.get_by_test_id("so-schema").input_value())
    page.get_by_test_id("so-run").click()
    verdict = page.get_by_test_id("so-verdict")
    expect(verdict).to_be_visible(timeout=ANSWER_MS)
    output = page.get_by_test_id("so-output").inner_text()
    expect(verdict).to_have_attribute("data-verdict", "valid")
    expect(verdict).to_have_text(re.compile(r"^valid"))
    obj = json.loads(output)
    assert isinstance(obj, dict) and set(schema["required"]) <= set(obj), obj
    check = httpx.post(
        f"{playground.base}/api/validate", json={"schema": schema, "text": output}, timeout=30
    )
    assert check.json()["schema_ok"] is True, check.text

    # a schema the model server refuses: its sentence is shown, no verdict
    page.get_by_test_id("so-schema").fill(
        '{"type": "object", "properties": {"a": {"type": "strin"}}}'
    )
    page.get_by_test_id("so-run").click()
    alert = view(page, "structured").get_by_test_id("error")
    expect(alert).to_contain_text("strin", timeout=ANSWER_MS)
    expect(verdict).to_be_hidden()


def test_regex_and_choice_answers_are_checked(page, playground):
    ensure_ready(page, playground)
    page.get_by_test_id("tab-structured").click()
    verdict = page.get_by_test_id("so-verdict")
    page.get_by_test_id("so-mode").select_option("regex")
    page.get_by_test_id("so-example").select_option(label="ISO date")
    pattern = page.get_by_test_id("so-schema").input_value()
    page.get_by_test_id("so-run").click()
    expect(verdict).to_have_attribute("data-verdict", "valid", timeout=ANSWER_MS)
    assert re.fullmatch(pattern, page.get_by_test_id("so-output").inner_text()), pattern

    page.get_by_test_id("so-mode").select_option("choice")
    page.get_by_test_id("so-example").select_option(label="colour")
    choices = page.get_by_test_id("so-schema").input_value().split("\n")
    page.get_by_test_id("so-run").click()
    expect(verdict).to_be_hidden()
    expect(verdict).to_have_attribute("data-verdict", "valid", timeout=ANSWER_MS)
    expect(verdict).to_have_text(re.compile(r"^valid"))
    assert page.get_by_test_id("so-output").inner_text() in choices, choices


def test_completion_mode_streams_plain_text(page, playground):
    ensure_ready(page, playground)
    page.get_by_test_id("tab-chat").click()
    page.get_by_test_id("mode").select_option("completion")
    answer = ask(page, "The three primary colours are", max_tokens=24)
    expect(answer).to_have_attribute("data-state", "done", timeout=ANSWER_MS)
    text = answer.inner_text()
    assert text.startswith("The three primary colours are") and len(text) > len(
        "The three primary colours are"
    )
    expect(page.get_by_test_id("answer-stats").last).to_have_text(STATS)
    page.get_by_test_id("copy-curl").click()
    snippet = page.get_by_test_id("api-snippet").inner_text()
    assert (
        "/v1/completions" in snippet and '"prompt": "The three primary colours are"' in snippet
    ), snippet


def test_settings_are_checked_in_the_page_and_by_the_server(page, playground):
    ensure_ready(page, playground)
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/api/chat" in r.url else None)
    page.get_by_test_id("tab-chat").click()
    page.get_by_test_id("temperature").fill("5")
    page.get_by_test_id("prompt").fill("Hello")
    page.get_by_test_id("send").click()
    alert = view(page, "chat").get_by_test_id("error")
    expect(alert).to_contain_text("Temperature must be")
    expect(alert).to_contain_text("5")
    page.get_by_test_id("temperature").fill("0.7")
    page.get_by_test_id("top-k").fill("0")
    page.get_by_test_id("send").click()
    expect(alert).to_contain_text("Top-k must be -1")
    page.wait_for_timeout(300)
    assert sent == [], f"the page sent a request with a bad setting: {sent}"
    expect(page.get_by_test_id("answer")).to_have_count(0)

    # beyond what the page knows (the model's context): the server's 400 sentence is shown
    page.get_by_test_id("top-k").fill("-1")
    page.get_by_test_id("max-tokens").fill("200000")
    page.get_by_test_id("send").click()
    expect(alert).to_contain_text("max_tokens must be")
    expect(alert).to_contain_text("200000")
    expect(page.get_by_test_id("answer").last).to_have_attribute("data-state", "error")
    assert len(sent) == 1


def test_bad_paths_are_refused_while_the_model_keeps_answering(page, playground):
    before = status(playground)
    if before["state"] != "ready":
        before = ensure_ready(page, playground)
    roots = playground.api("models").json()["roots"]
    alert = view(page, "models").get_by_test_id("error")

    page.get_by_test_id("local-path").fill("/etc")
    page.get_by_test_id("load-path").click()
    expect(alert).to_be_visible()
    expect(alert).to_have_attribute("role", "alert")
    outside = alert.inner_text()
    assert "/etc" in outside and re.search(r"allowed|outside", outside, re.I), outside

    missing = f"{roots[0]}/no-such-model-here"
    page.get_by_test_id("local-path").fill(missing)
    page.get_by_test_id("load-path").click()
    # the page empties the alert while the request is out, then shows the answer
    expect(alert).to_contain_text("no-such-model-here")
    text = alert.inner_text()
    assert "no-such-model-here" in text and len(text.split()) >= 4, text

    after = status(playground)
    assert after["state"] == "ready" and after["model"] == before["model"], after
    expect(page.get_by_test_id("status")).to_contain_text("ready")
    answer = ask(page, "Say hello.", max_tokens=16)
    expect(answer).to_have_attribute("data-state", "done", timeout=ANSWER_MS)
    assert answer.inner_text().strip()


def test_int8_answers(page, playground):
    ensure_ready(page, playground, precision="int8")
    expect(page.get_by_test_id("header-status")).to_contain_text("int8")
    page.get_by_test_id("tab-chat").click()
    page.get_by_test_id("new-chat").click()
    answer = ask(page, "What is the capital of France?", max_tokens=32)
    expect(answer).to_have_attribute("data-state", "done", timeout=ANSWER_MS)
    assert answer.inner_text().strip()
    expect(page.get_by_test_id("answer-stats").last).to_have_text(STATS)


def test_every_view_loads_only_from_the_playground(browser, playground):
    context = browser.new_context()
    page = context.new_page()
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(playground.base + "/")
    for tab in ("models", "chat", "structured", "server"):
        page.get_by_test_id(f"tab-{tab}").click()
        page.wait_for_timeout(500)
    expect(page.get_by_test_id("server-doctor")).not_to_have_text("…", timeout=60_000)
    page.wait_for_timeout(2500)  # a metrics poll
    context.close()
    own = urlsplit(playground.base).netloc
    hosts = {urlsplit(u).netloc for u in urls if urlsplit(u).scheme not in ("data", "blob")}
    assert hosts == {own}, f"requests left the playground: {sorted(set(urls))}"
    paths = {urlsplit(u).path for u in urls}
    for p in (
        "/",
        "/static/app.js",
        "/static/style.css",
        "/api/models",
        "/api/status",
        "/api/examples",
        "/api/server",
    ):
        assert p in paths, (p, sorted(paths))


def test_page_under_serve_playground(browser, default_model, tmp_path):
    """`vllm-x86 serve --playground`: the same files under /playground/ (relative URLs),
    chatting with the one model that server serves."""
    from tests.e2e.conftest import ServeProcess

    srv = ServeProcess(
        default_model.name,
        ["--playground", "--enforce-eager", "--max-model-len", "512"],
        tmp_path / "serve.log",
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        page.goto(srv.base + "/playground")  # redirects to /playground/
        expect(page.get_by_test_id("status")).to_contain_text("ready", timeout=60_000)
        expect(page.get_by_test_id("attached-note")).to_be_visible()
        expect(page.get_by_test_id("model-row").first.get_by_test_id("load")).to_be_hidden()
        answer = ask(page, "Name a colour.", max_tokens=16)
        expect(answer).to_have_attribute("data-state", "done", timeout=ANSWER_MS)
        assert answer.inner_text().strip()
        expect(page.get_by_test_id("answer-stats").last).to_have_text(STATS)
        # the request as curl, against this server, runs as it is
        page.get_by_test_id("copy-curl").click()
        snippet = page.get_by_test_id("api-snippet").inner_text()
        assert f"curl -N {srv.base}/v1/chat/completions" in snippet, snippet
        run = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "data: [DONE]" in run.stdout, (run.stdout, run.stderr)
        page.get_by_test_id("copy-python").click()
        snippet = page.get_by_test_id("api-snippet").inner_text()
        assert f'base_url="{srv.base}/v1"' in snippet, snippet
        run = subprocess.run(
            [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0 and run.stdout.strip(), (run.stdout, run.stderr[-2000:])
        paths = [urlsplit(u).path for u in urls if urlsplit(u).scheme in ("http", "https")]
        assert paths and all(p.startswith("/playground") for p in paths), sorted(set(paths))
        assert "/playground/api/chat" in paths and "/playground/static/app.js" in paths, sorted(
            set(paths)
        )
    finally:
        context.close()
        srv.stop()


def test_page_asks_for_the_key_and_sends_it(browser, tmp_path):
    """A playground with a key: the page asks for it on the first 401, keeps it for the
    tab and sends it; a wrong key is asked for again."""
    pg = Playground(tmp_path, clean_env(), args=("--api-key", "sesame-123"))
    context = browser.new_context()
    try:
        assert pg.api("models").status_code == 401
        page = context.new_page()
        page.goto(pg.base + "/")
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        page.get_by_test_id("api-key").fill("wrong")
        page.get_by_test_id("api-key-ok").click()
        expect(dialog).to_be_visible()  # asked again
        page.get_by_test_id("api-key").fill("sesame-123")
        page.get_by_test_id("api-key").press("Enter")
        expect(dialog).to_be_hidden()
        expect(page.get_by_test_id("model-row").first).to_be_visible()
        expect(page.get_by_test_id("status")).to_contain_text(re.compile("idle|starting|ready"))
        stored = page.evaluate("sessionStorage.getItem('vllm-x86-playground-key')")
        assert stored == "sesame-123"
    finally:
        context.close()
        pg.stop()


RENDER = """async (text) => {
  const md = await import("./static/markdown.js");
  return md.renderMarkdown(text);
}"""


def test_markdown_renderer_escapes_html_and_keeps_only_http_links(page):
    html = page.evaluate(
        RENDER,
        "# Title\n\n**bold** and *it* `<code>`\n\n- a\n- b\n\n1. one\n2. two\n\n"
        "```js\nif (a < b) alert(1)\n```\n\n"
        '<img src=x onerror="alert(1)"> <script>alert(2)</script>\n'
        "[ok](https://example.org/a_b_c) [bad](javascript:alert(3)) [data](data:text/html,hi)",
    )
    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<code>&lt;code&gt;</code>" in html
    assert "<ul><li>a</li><li>b</li></ul>" in html and "<ol><li>one</li><li>two</li></ol>" in html
    assert '<pre><code class="language-js">if (a &lt; b) alert(1)</code></pre>' in html
    assert "<img" not in html and "<script" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert (
        '<a href="https://example.org/a_b_c" target="_blank" rel="noopener noreferrer">ok</a>'
        in html
    )
    assert 'href="javascript' not in html and 'href="data' not in html
    assert "[bad](javascript:alert(3))" in html
