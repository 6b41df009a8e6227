#!/usr/bin/env python3
"""Drives web/index.html in headless Chromium over the DevTools protocol (--remote-debugging-pipe: JSON
messages ended by NUL on file descriptors 3 and 4, so only the standard library is needed) and checks
what it shows: LLaMA 7B at 4,096 (the training state, and the peak under each recomputation mode), the
timeline redrawn on switching recomputation with the recomputed layer in each backward step, the device
line, a pasted config.json, a bad one's error message, which must be the command line's own, a
shared link (its settings in the URL) opened afresh, and the tabs: fit, plan and serving, each showing
every figure of the native program's JSON for the command it shows, fine-tuning's peak, and a link
that opens the serving tab.

    drive_page.py [--chromium PATH] [--memcalc NATIVE] [--screenshot OUT.png [--height PX]] BUILD/web/index.html
"""
import argparse
import base64
import fcntl
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
CONFIGS = HERE.parent / "tests" / "configs"


class Browser:
    def __init__(self, chromium, log):
        self.profile = tempfile.mkdtemp(prefix="memcalc-chromium-")
        to_child, self.write_fd = os.pipe()
        self.read_fd, from_child = os.pipe()
        # The child's ends move to 3 and 4; above 10 first, so the moves cannot overwrite each other.
        high_in = fcntl.fcntl(to_child, fcntl.F_DUPFD, 10)
        high_out = fcntl.fcntl(from_child, fcntl.F_DUPFD, 10)
        args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--user-data-dir=" + self.profile, "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--window-size=1280,900", "about:blank"]
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pid = os.posix_spawn(chromium, args, os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, high_in, 3), (os.POSIX_SPAWN_DUP2, high_out, 4),
            (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)])
        for fd in (to_child, from_child, high_in, high_out, log_fd):
            os.close(fd)
        self.buffer = b""
        self.next_id = 0
        self.session = None
        self.exceptions = []

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except Exception:
            pass
        for _ in range(50):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.write_fd)
        os.close(self.read_fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the debugging pipe")
            self.buffer += chunk
        text, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(text)

    def call(self, method, session=True, **params):
        self.next_id += 1
        request = {"id": self.next_id, "method": method, "params": params}
        if session and self.session:
            request["sessionId"] = self.session
        os.write(self.write_fd, json.dumps(request).encode() + b"\0")
        while True:
            m = self.message()
            if m.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(m["params"]["exceptionDetails"])
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def open(self, url):
        page = next(t for t in self.call("Target.getTargets", session=False)["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", session=False, targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, what, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what} ({expression})")

    def screenshot(self, path, height=None):
        if not height:
            height = int(self.call("Page.getLayoutMetrics")["cssContentSize"]["height"]) + 1
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=height, deviceScaleFactor=1, mobile=False)
        time.sleep(0.3)
        clip = {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
        pathlib.Path(path).write_bytes(base64.b64decode(data))


# Helpers evaluated in the page.
def text(id_):
    return f"document.getElementById({json.dumps(id_)}).textContent"


SET = """(function (id, v) { var e = document.getElementById(id); e.value = v;
  e.dispatchEvent(new Event('change', {bubbles: true})); return true; })"""
TIMELINE = """(function () { var t = document.getElementById('timeline');
  var bars = Array.from(t.querySelectorAll('g.bar'));
  return {done: t.getAttribute('data-done'), drawn: +t.getAttribute('data-drawn'), steps: +t.getAttribute('data-steps'),
          visible: bars.filter(function (b) { return b.style.visibility !== 'hidden'; }).length,
          bars: bars.map(function (b) { return [b.getAttribute('data-step'), +b.getAttribute('data-bytes'), +b.getAttribute('data-rebuilt')]; })};
})()"""


def timeline_after(browser, previous_done):
    """The timeline once its drawing (begun after `previous_done`) has finished."""
    browser.wait(f"(function () {{ var d = document.getElementById('timeline').getAttribute('data-done');"
                 f" return d !== null && d !== {json.dumps(previous_done)}; }})()", "the timeline to be drawn")
    return browser.js(TIMELINE)


def recompute(browser, mode):
    before = browser.js("document.getElementById('timeline').getAttribute('data-done')")
    browser.js(f"document.querySelector('input[name=recompute][value={mode}]').click()")
    return timeline_after(browser, before)


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what)


def native_error(memcalc, config_text, page_path):
    """The native program's message for the same config.json, with the file named as the page names it."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "config.json"
        path.write_text(config_text)
        r = subprocess.run([memcalc, "--config", str(path), "--seq", "4096"], capture_output=True, text=True)
        return r.stderr.strip().replace(str(path), page_path)


def run_checks(browser, args):
    browser.wait("!!document.body && document.body.getAttribute('data-ready') === 'true'", "the page to start")
    timelines = {"none": timeline_after(browser, None)}
    check(browser.js(text("state")) == "107.8 GB", f"LLaMA 7B at 4,096: state {browser.js(text('state'))} (107.8 GB)")
    peaks = {"none": browser.js(text("peak"))}
    for mode in ("selective", "full"):
        timelines[mode] = recompute(browser, mode)
        peaks[mode] = browser.js(text("peak"))
    check(peaks == {"none": "199.5 GB", "selective": "116.1 GB", "full": "110.7 GB"},
          f"peaks under none/selective/full: {peaks} (199.5 / 116.1 / 110.7 GB)")
    for mode, t in timelines.items():
        check(t["steps"] == len(t["bars"]) == t["drawn"] == t["visible"] == 66,
              f"{mode}: all {t['steps']} steps drawn, one bar each")
        backward = [b for b in t["bars"] if b[0].startswith("backward")]
        rebuilt = [b for b in backward if b[2] > 0]
        if mode == "none":
            check(len(backward) == 32 and not rebuilt, "none: no recomputed layer in the 32 backward steps")
        else:
            check(len(rebuilt) == len(backward) == 32, f"{mode}: a recomputed layer in each of the 32 backward steps")
            check(not any(b[2] for b in t["bars"] if not b[0].startswith("backward")),
                  f"{mode}: no recomputed layer outside backward")
    check(timelines["none"]["bars"] != timelines["selective"]["bars"] != timelines["full"]["bars"],
          "switching recomputation redraws the timeline with other bars")
    check(max(b[1] for b in timelines["selective"]["bars"]) == 116095778816, "selective: the tallest bar is the peak")
    # Play: the bars appear one after another, each step's breakdown shown as its bar appears.
    before = browser.js("document.getElementById('timeline').getAttribute('data-done')")
    browser.js("document.getElementById('play').click()")
    time.sleep(0.5)
    midway = browser.js(TIMELINE)
    label = browser.js(text("step-label"))
    after = timeline_after(browser, before)
    check(midway["visible"] < 66 and after["visible"] == 66,
          f"playing step by step: {midway['visible']} bars after half a second ({label[:30]}...), then all 66")
    device = browser.js(text("device"))
    # The verdict weighs the device figure's high end (the allocator and the rows beside it).
    high = ""
    if args.memcalc:
        full = native_json(args.memcalc, "memcalc --preset llama-7b --seq 4096 --recompute full --gpu h100-sxm")
        high = f"the device's {full['peak']['device_band']['high_bytes'] / 1e9:.1f} GB (high end)"
    check("does not fit in 85.5 GB: " in device and high in device,
          f"device line on the H100 SXM: {device!r} ({high})")
    modes = browser.js("Array.from(document.querySelectorAll('#modes button')).map(function (b) { return b.textContent; })")
    check(modes == ["none 199.5 GB", "selective 116.1 GB", "full 110.7 GB"], f"the recomputation strip: {modes}")
    params = browser.js("document.querySelectorAll('#parameter-table tbody tr').length")
    acts = browser.js("document.querySelectorAll('#activation-table tbody tr').length")
    check(params == 12 and acts == 14, f"parameter table {params} rows, activation table {acts} rows")

    # A parallel layout that fits: ZeRO-3 over 8 data-parallel ranks.
    before = browser.js("document.getElementById('timeline').getAttribute('data-done')")
    browser.js(f"{SET}('dp', '8') && {SET}('zero', '3')")
    timeline_after(browser, before)
    device = browser.js(text("device"))
    check(device.startswith("NVIDIA H100") and "fits in 85.5 GB: " in device
          and "does not" not in device,
          f"dp 8, ZeRO-3: {device!r}")
    browser.js(f"{SET}('dp', '1') && {SET}('zero', '0')")

    # A config.json pasted in: LLaMA 2 7B's, the same model as the preset.
    config = (CONFIGS / "llama-2-7b.json").read_text()
    before = browser.js("document.getElementById('timeline').getAttribute('data-done')")
    browser.js(f"document.querySelector('input[name=source][value=config]').checked = true;"
               f"{SET}('config', {json.dumps(config)})")
    timeline_after(browser, before)
    check(browser.js("document.getElementById('error').hidden") and browser.js(text("state")) == "107.8 GB",
          f"LLaMA 2 7B's config.json: state {browser.js(text('state'))}, full peak {browser.js(text('peak'))}")

    # Bad ones: the command line's error message, and no stale result beside it.
    previous = ""
    for bad in ('{"model_type": "llama", "hidden_size": ', '{"model_type": "llama", "hidden_size": 4096}'):
        browser.js(f"{SET}('config', {json.dumps(bad)})")
        message = browser.wait(f"!document.getElementById('error').hidden && {text('error')} !== {json.dumps(previous)}"
                               f" && {text('error')}", "the error message")
        previous = message
        check(message.startswith("memcalc: /config.json: ") and browser.js("document.getElementById('output').hidden"),
              f"bad config.json {bad!r} shows {message!r}")
        if args.memcalc:
            expected = native_error(args.memcalc, bad, "/config.json")
            check(message == expected, "the same message as the native program's")
    link_checks(browser, args)
    tab_checks(browser, args)
    tab_link_checks(browser, args)
    check(not browser.exceptions, f"no uncaught exception in the page {browser.exceptions[:1]}")


LINK = "#preset=gpt2&seq=1024&micro-batch=4&recipe=mixed-adam&dp=2&tp=1&pp=1&zero=1&gpu=a100-80gb&recompute=full"


def link_checks(browser, args):
    """The page's settings ride in its link: a link opened afresh shows that answer, the command line's,
    and changing a setting rewrites the link."""
    url = browser.js("location.href.split('#')[0]")
    browser.call("Page.navigate", url="about:blank")
    browser.wait("location.href === 'about:blank'", "a blank page")
    browser.call("Page.navigate", url=url + LINK)
    browser.wait("!!document.body && document.body.getAttribute('data-ready') === 'true'", "the linked page to start")
    bars = timeline_after(browser, None)["bars"]
    command = browser.js(text("command"))
    expected = "memcalc --preset gpt2 --seq 1024 --micro-batch 4 --dp 2 --zero 1 --gpu a100-80gb --recompute full --timeline"
    check(command == expected, f"a shared link opens its settings: {command!r}")
    if args.memcalc:
        native = json.loads(subprocess.run([args.memcalc] + expected.split()[1:-1] + ["--format", "json"],
                                           capture_output=True, text=True, check=True).stdout)
        check(max(b[1] for b in bars) == native["peak"]["bytes"],
              f"the linked page's tallest bar is the command line's peak ({native['peak']['bytes']:,} B)")
    before = browser.js("document.getElementById('timeline').getAttribute('data-done')")
    browser.js(f"{SET}('seq', '512')")
    timeline_after(browser, before)
    check("seq=512" in browser.js("location.hash") and "recompute=full" in browser.js("location.hash"),
          f"a changed setting rewrites the link: {browser.js('location.hash')}")


ANSWER = """(function () { var a = document.getElementById('answer');
  return {tab: a.getAttribute('data-tab'), done: a.getAttribute('data-done'), hidden: a.hidden,
          active: document.querySelector('#tabs button.active').getAttribute('data-tab'),
          cells: Array.from(a.querySelectorAll('td[data-path]')).map(function (c) {
            return [c.getAttribute('data-path'), c.getAttribute('data-value'), c.textContent]; })};
})()"""


def answer_after(browser, previous_done):
    """The fit, plan or serving tab's tables once shown (after `previous_done`)."""
    browser.wait(f"(function () {{ var d = document.getElementById('answer').getAttribute('data-done');"
                 f" return !document.getElementById('error').hidden"
                 f" || (d !== null && d !== {json.dumps(previous_done)}); }})()", "the answer")
    check(browser.js("document.getElementById('error').hidden"), f"the page shows no error {browser.js(text('error'))!r}")
    return browser.js(ANSWER)


def done(browser, id_):
    return browser.js(f"document.getElementById({json.dumps(id_)}).getAttribute('data-done')")


def native_json(memcalc, command):
    """What the native program prints for the page's command line (less --timeline) in JSON."""
    argv = [a for a in shlex.split(command)[1:] if a != "--timeline"] + ["--format", "json"]
    return json.loads(subprocess.run([memcalc] + argv, capture_output=True, text=True, check=True).stdout)


def json_leaves(v, path=()):
    """Every figure of a JSON value with its path, as the page places them: a list of plain values is
    one figure."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from json_leaves(x, path + (k,))
    elif isinstance(v, list) and any(isinstance(x, dict) for x in v):
        for i, x in enumerate(v):
            yield from json_leaves(x, path + (str(i),))
    else:
        yield "/".join(path), v


# plan's "seconds" is how long its search took: the page's run and the native one differ.
VOLATILE = {"seconds"}


def figures_match(answer, native, what):
    shown = {path: json.loads(v) for path, v, _ in answer["cells"] if path not in VOLATILE}
    expected = {path: v for path, v in json_leaves(native) if path not in VOLATILE}
    wrong = [p for p in expected if shown.get(p, "(absent)") != expected[p]]
    check(not wrong and shown.keys() == expected.keys(),
          f"{what}: every one of the native JSON's {len(expected)} figures shown, equal {wrong[:3]}")
    unlike = [(p, t) for p, v, t in answer["cells"]
              if p.endswith("bytes") and isinstance(json.loads(v), int) and not t.startswith(f"{json.loads(v):,}")]
    check(not unlike, f"{what}: bytes shown exactly {unlike[:2]}")


def tab_checks(browser, args):
    """Fit, plan and serving show the JSON of the command they show; fine-tuning the estimate's."""
    before = done(browser, "timeline")
    browser.js(f"{SET}('preset', 'llama-3.2-1b')")
    timeline_after(browser, before)
    for tab in ("fit", "plan", "serve"):
        before = done(browser, "answer")
        browser.js(f"document.querySelector('#tabs button[data-tab={tab}]').click()")
        answer = answer_after(browser, before)
        command = browser.js(text("command"))
        check(answer["tab"] == answer["active"] == tab and not answer["hidden"]
              and command.startswith(f"memcalc {tab} --preset llama-3.2-1b ") and f"tab={tab}" in browser.js("location.hash"),
              f"the {tab} tab: {command!r}")
        if args.memcalc:
            figures_match(answer, native_json(args.memcalc, command), tab)
    # A setting of the tab's own: serving int4 weights.
    before = done(browser, "answer")
    browser.js(f"{SET}('serve-weights', 'int4')")
    answer = answer_after(browser, before)
    command = browser.js(text("command"))
    check("--weights int4" in command and "weights=int4" in browser.js("location.hash"),
          f"serving int4 weights: {command!r}")
    if args.memcalc:
        figures_match(answer, native_json(args.memcalc, command), "serving int4")

    before = done(browser, "timeline")
    browser.js("document.querySelector('#tabs button[data-tab=finetune]').click()")
    for train in ("lora", "qlora", "frozen"):
        if train != "lora":
            before = done(browser, "timeline")
            browser.js(f"{SET}('train', {json.dumps(train)})")
        bars = timeline_after(browser, before)["bars"]
        command = browser.js(text("command"))
        rank_shown = not browser.js("document.getElementById('lora-rank').closest('[data-if]').hidden")
        check(f"--train {train}" in command and ("--lora-rank" in command) == rank_shown == (train != "frozen")
              and ("--frozen" in command) == (train == "frozen"), f"fine-tuning, {train}: {command!r}")
        if args.memcalc:
            native = native_json(args.memcalc, command)
            exact = browser.js(text("parameters-exact"))
            check(max(b[1] for b in bars) == native["peak"]["bytes"]
                  and f"({native['parameters']['trainable']:,} trainable)" in exact
                  and native["parameters"]["trainable"] < native["parameters"]["total"],
                  f"fine-tuning, {train}: the native peak ({native['peak']['bytes']:,} B) and trainable count")


SERVE_LINK = "#tab=serve&preset=llama-3-8b&gpu=h100-sxm&context=4096&batch=16&tp=1&weights=int8&kv-dtype=fp8"


def tab_link_checks(browser, args):
    """A link naming a tab opens that tab's answer."""
    url = browser.js("location.href.split('#')[0]")
    browser.call("Page.navigate", url="about:blank")
    browser.wait("location.href === 'about:blank'", "a blank page")
    browser.call("Page.navigate", url=url + SERVE_LINK)
    browser.wait("!!document.body && document.body.getAttribute('data-ready') === 'true'", "the linked page to start")
    answer = answer_after(browser, None)
    command = browser.js(text("command"))
    expected = "memcalc serve --preset llama-3-8b --context 4096 --batch 16 --tp 1 --weights int8 --kv-dtype fp8 --gpu h100-sxm"
    check(answer["tab"] == answer["active"] == "serve" and command == expected
          and browser.js("document.getElementById('output').hidden"),
          f"a link to the serving tab opens its answer: {command!r}")
    if args.memcalc:
        figures_match(answer, native_json(args.memcalc, command), "the linked serving tab")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--memcalc", help="the native program, to compare error messages with")
    parser.add_argument("--screenshot", help="only take a screenshot (LLaMA 7B, selective recomputation) into this PNG")
    parser.add_argument("--height", type=int, help="the screenshot's height in pixels (default: the whole page)")
    args = parser.parse_args()
    url = pathlib.Path(args.page).resolve().as_uri()
    started = time.time()
    with tempfile.NamedTemporaryFile(prefix="memcalc-chromium-", suffix=".log") as log:
        browser = Browser(args.chromium, log.name)
        try:
            browser.open(url)
            if args.screenshot:
                browser.wait("!!document.body && document.body.getAttribute('data-ready') === 'true'", "the page to start")
                timeline_after(browser, None)
                recompute(browser, "selective")
                browser.screenshot(args.screenshot, args.height)
            else:
                run_checks(browser, args)
        except Exception:
            sys.stderr.write(pathlib.Path(log.name).read_text(errors="replace")[-3000:])
            raise
        finally:
            browser.close()
    print(f"{time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
