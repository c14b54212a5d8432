// Real-browser test of the live canvas view (web/canvas_view.js) and its ComfyUI glue
// (web/live_view.js, against stand-ins for ComfyUI's app/api modules).
//
//   cd tests/browser && npm install && node live_view.test.mjs
//
// Needs Debian's chromium (/usr/bin/chromium, or $CHROMIUM) and playwright-core from
// tests/browser/node_modules. Replays events.json, a stream recorded from the real engine by
// record_events.py. Screenshots go to $DGEMMA_SHOT_DIR or a fresh temp dir (printed).
// Exit codes: 0 all passed, 1 a check failed, 2 the browser or page failed, 3 a dependency is
// missing.

import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

function missing(what, how) {
  console.error(`MISSING ${what}: ${how}`);
  process.exit(3);
}

if (!fs.existsSync(CHROMIUM)) {
  missing(`chromium at ${CHROMIUM}`, "install it with `apt-get install -y chromium` (or set $CHROMIUM), "
    + "or run .ci/browser.sh");
}
let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (err) {
  missing("playwright-core", `run \`npm install\` in ${HERE} (or .ci/browser.sh); ${err.message}`);
}

// ---------------------------------------------------------------- fixture

const recorded = JSON.parse(fs.readFileSync(path.join(HERE, "events.json"), "utf8"));
const EVENTS = recorded.events;
const START = EVENTS.find((e) => e.type === "dgemma.start").data;
const STEPS = EVENTS.filter((e) => e.type === "dgemma.step").map((e) => e.data);
const DONE = EVENTS.find((e) => e.type === "dgemma.done").data;
const L = START.canvas_length;
const join = (tokens) => tokens.join("");
// A list run of four prompts on the demo model (record_events.py --batch): one row per item.
const BATCH = JSON.parse(fs.readFileSync(path.join(HERE, "batch_events.json"), "utf8")).events;
const B_START = BATCH[0].data;
const B_STEPS = BATCH.filter((e) => e.type === "dgemma.step").map((e) => e.data);
const B_DONE = BATCH[BATCH.length - 1].data;

/** The text a view must show after `steps`: each finished block's last tokens, then the last step's. */
function expectedText(steps) {
  let text = "";
  for (let i = 0; i < steps.length - 1; i++) {
    if (steps[i + 1].block !== steps[i].block) text += join(steps[i].tokens);
  }
  return text + join(steps[steps.length - 1].tokens);
}

// ---------------------------------------------------------------- static server

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
  ".json": "application/json", ".css": "text/css" };
const ROUTES = [
  ["/scripts/", path.join(HERE, "fake_comfy")], // what ../../scripts/app.js resolves to from /web/
  ["/web/", path.join(REPO, "web")],
  ["/tests/browser/", HERE],
];

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://127.0.0.1");
  if (url.pathname === "/favicon.ico") {
    res.writeHead(204).end();
    return;
  }
  const route = ROUTES.find(([prefix]) => url.pathname.startsWith(prefix));
  const file = route && path.resolve(route[1], "." + url.pathname.slice(route[0].length - 1));
  if (!route || !file.startsWith(route[1] + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
    res.writeHead(404).end("not found");
    return;
  }
  res.writeHead(200, { "content-type": TYPES[path.extname(file)] || "application/octet-stream",
    "cache-control": "no-store" });
  fs.createReadStream(file).pipe(res);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const BASE = `http://127.0.0.1:${server.address().port}`;

// ---------------------------------------------------------------- checks

const shotDir = process.env.DGEMMA_SHOT_DIR || fs.mkdtempSync(path.join(os.tmpdir(), "dgemma-live-view-"));
fs.mkdirSync(shotDir, { recursive: true });
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "dgemma-chromium-"));
const results = [];
let failed = 0;

function assert(cond, message) {
  if (!cond) throw new Error(message);
}
function assertEq(actual, expected, what) {
  if (actual !== expected) {
    const show = (v) => JSON.stringify(v)?.slice(0, 300);
    throw new Error(`${what}: expected ${show(expected)}, got ${show(actual)}`);
  }
}

async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (err) {
    failed += 1;
    results.push(`FAIL ${name}: ${err.message}`);
  }
  console.log(results[results.length - 1]);
}

const t0 = Date.now();
let context;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 780, height: 600 },
  });
} catch (err) {
  console.error(`browser failed to start: ${err.message}`);
  server.close();
  process.exit(2);
}

const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
const consoleErrors = [];
const dialogs = [];
page.on("pageerror", (err) => pageErrors.push(String(err)));
page.on("console", (msg) => { if (msg.type() === "error") consoleErrors.push(msg.text()); });
page.on("response", (r) => { if (r.status() >= 400) consoleErrors.push(`HTTP ${r.status()} ${r.url()}`); });
page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss().catch(() => {}); });

try {
  await page.goto(`${BASE}/tests/browser/harness.html`);
  await page.waitForFunction(() => window.__ready === true, null, { timeout: 10000 });

  // Helpers in the page: feed events, wait for animation frames, read what is painted.
  await page.evaluate(() => {
    window.frames2 = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    // A sampler node as ComfyUI makes one, given to the live view's extension (loaded by the first glue check).
    window.glueNode = async (cls, id) => {
      const { app, FakeNode } = await import("/scripts/app.js");
      const host = document.createElement("div");
      document.body.appendChild(host);
      const n = new FakeNode(cls, id, host);
      app.extensions.find((e) => e.name === "DiffusionGemma.LiveView").nodeCreated(n, app);
      n.id = id;
      app.rootGraph.add(n);
      return n;
    };
    window.feed = (view, events) => {
      for (const e of events) view[e.type.slice("dgemma.".length)](e.data);
    };
    window.painted = (view) => ({
      text: view.textElement.textContent,
      header: view.element.querySelector(".dg-header").textContent,
      spans: view.element.querySelectorAll(".dg-canvas > span").length,
      noise: view.element.querySelectorAll(".dg-canvas > .dg-noise").length,
      fresh: view.element.querySelectorAll(".dg-canvas > .dg-new").length,
      settled: view.element.querySelectorAll(".dg-canvas > .dg-settled").length,
      nodes: view.element.getElementsByTagName("*").length,
      stats: view.stats(),
    });
  });

  await check("idle view shows a waiting header and no text", async () => {
    const p = await page.evaluate(() => painted(view));
    assertEq(p.text, "", "idle text");
    assert(/waiting/.test(p.header), `idle header: ${p.header}`);
  });

  await check("(a) mid-run: block 2 follows block 1's final text", async () => {
    const firstOfBlock1 = STEPS.findIndex((s) => s.block === 1);
    assert(firstOfBlock1 > 0, "fixture has no second block");
    const upto = STEPS.slice(0, firstOfBlock1 + 1);
    const events = [{ type: "dgemma.start", data: START }, ...upto.map((d) => ({ type: "dgemma.step", data: d }))];
    const p = await page.evaluate(async (events) => { feed(view, events); await frames2(); return painted(view); }, events);
    assertEq(p.text, expectedText(upto), "painted text");
    assertEq(p.spans, L, "span count");
    await page.screenshot({ path: path.join(shotDir, "1-block2-step1.png") });
  });

  await check("(a) whole recorded run: text, state classes, header", async () => {
    const p = await page.evaluate(async (events) => { feed(view, events); await frames2(); return painted(view); }, EVENTS);
    const lastStep = STEPS[STEPS.length - 1];
    assertEq(p.text, expectedText(STEPS), "painted text");
    assertEq(p.spans, L, "span count");
    const count = (c) => [...lastStep.state].filter((s) => s === c).length;
    assertEq(p.noise, count("0"), "noise spans");
    assertEq(p.fresh, 0, "a finished run keeps no 'new' highlight");
    assertEq(p.settled, count("1") + count("2"), "settled spans (the last step's new ones too)");
    assert(p.header.startsWith(`done, ${DONE.steps_used} steps`), `header done: ${p.header}`);
    assert(p.header.includes(`committed ${Math.round(lastStep.committed * 100)}%`), `header committed: ${p.header}`);
    assert(p.header.length <= 40, `the done header must fit a default-width node: ${p.header}`);
    const style = await page.evaluate(() => ({
      ws: getComputedStyle(view.textElement).whiteSpace,
      noise: getComputedStyle(view.element.querySelector(".dg-noise")).color,
      settled: getComputedStyle(view.element.querySelector(".dg-settled")).color,
    }));
    assertEq(style.ws, "pre-wrap", "white-space of the text");
    const rgb = (hex) => `rgb(${[1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)).join(", ")})`;
    assertEq(style.noise, rgb(START.palette.noise), "noise colour from the engine's palette");
    assertEq(style.settled, rgb(START.palette.settled), "settled colour from the engine's palette");
    await page.screenshot({ path: path.join(shotDir, "2-run-done.png") });
  });

  await check("(b) dgemma.start clears the view, and the next run shows only its own text", async () => {
    const p = await page.evaluate(async (start) => { view.start(start); await frames2(); return painted(view); }, START);
    assertEq(p.text, "", "text after start");
    assertEq(p.spans, 0, "spans after start");
    assert(/starting/.test(p.header), `header after start: ${p.header}`);
    const q = await page.evaluate(async (step) => { view.step(step); await frames2(); return painted(view); }, STEPS[0]);
    assertEq(q.text, join(STEPS[0].tokens), "text of the new run's first step");
  });

  await check("(b2) an error and an interrupt are shown, and the next run recovers", async () => {
    const shown = (done) => page.evaluate(async ({ start, steps, done }) => {
      view.start(start); steps.forEach((s) => view.step(s)); view.done(done); await frames2();
      return { ...painted(view), cls: view.element.className };
    }, { start: START, steps: STEPS.slice(0, 2), done });
    const err = await shown({ node: "7", status: "error", message: "prompt is empty; type a prompt", steps_used: 0 });
    assert(err.header.startsWith("error: prompt is empty"), `error header: ${err.header}`);
    assert(err.cls.includes("dg-error"), `error class: ${err.cls}`);
    const cut = await shown({ node: "7", status: "interrupted", message: "", steps_used: 2 });
    assertEq(cut.header, `interrupted at block 1 step ${STEPS[1].step + 1}`, "interrupted header");
    assert(cut.cls.includes("dg-interrupted"), `interrupted class: ${cut.cls}`);
    const again = await page.evaluate(async (events) => { feed(view, events); await frames2();
      return { ...painted(view), cls: view.element.className }; }, EVENTS);
    assert(again.header.startsWith("done,") && again.cls.includes("dg-finished"), `recovered: ${again.header}`);
  });

  await check("(c) markup in tokens is shown as literal text and never runs", async () => {
    const evil = structuredClone(STEPS[STEPS.length - 1]);
    const payloads = ["<script>alert(1)</script>", '<img src=x onerror="window.__pwned=1">',
      "<b>bold</b>", "&amp;", "<svg onload=window.__pwned=2>"];
    payloads.forEach((s, i) => { evil.tokens[i * 3] = s; evil.state = "1" + evil.state.slice(1); });
    const p = await page.evaluate(async ({ start, evil }) => {
      view.start(start); view.step(evil); await frames2();
      await new Promise((r) => setTimeout(r, 300)); // time for an injected <img> to fail and fire
      return { ...painted(view), pwned: window.__pwned,
        elements: [...view.textElement.querySelectorAll("img,script,svg,b")].map((e) => e.tagName),
        htmlHasTag: /<(img|script|svg|b)[\s>]/i.test(view.textElement.innerHTML) };
    }, { start: START, evil });
    assertEq(p.pwned, undefined, "window.__pwned");
    assertEq(p.elements.length, 0, `elements created from tokens (${p.elements})`);
    assertEq(p.htmlHasTag, false, "innerHTML contains a live tag");
    assertEq(p.text, join(evil.tokens), "painted text");
    for (const s of payloads) assert(p.text.includes(s), `literal ${s} missing`);
    assertEq(dialogs.length, 0, `dialogs opened (${dialogs})`);
    await page.screenshot({ path: path.join(shotDir, "3-markup-as-text.png") });
  });

  await check("newline tokens render as line breaks", async () => {
    const tops = await page.evaluate(async () => {
      const aux = createCanvasView(document.getElementById("aux"));
      aux.step({ node: "x", block: 0, step: 0, blocks: 1, steps: 1, t: 1, T: 0.8, committed: 1,
        tokens: ["first", "\n", "second", " same"], state: "2222" });
      await frames2();
      const spans = aux.element.querySelectorAll(".dg-canvas > span");
      const r = [...spans].map((s) => s.getBoundingClientRect().top);
      aux.destroy();
      return r;
    });
    assert(tops[2] > tops[0] + 5, `"second" should be on the next line: tops ${tops}`);
    assert(Math.abs(tops[3] - tops[2]) < 2, `" same" should stay on the line of "second": tops ${tops}`);
  });

  await check("state names and colours come from the start event (constrained positions)", async () => {
    const r = await page.evaluate(async () => {
      const aux = createCanvasView(document.getElementById("aux"));
      aux.start({ node: "x", blocks: 1, steps: 1, canvas_length: 3, states: ["noise", "new", "settled", "pinned",
        "constrained"], palette: { constrained: "#c878ff" } });
      aux.step({ node: "x", block: 0, step: 0, blocks: 1, steps: 1, t: 1, T: 0.8, committed: 1,
        tokens: ["{", "a", "}"], state: "412" });
      await frames2();
      const spans = [...aux.element.querySelectorAll(".dg-canvas > span")];
      const out = { classes: spans.map((s) => s.className), colour: getComputedStyle(spans[0]).color };
      aux.destroy();
      return out;
    });
    assertEq(r.classes.join(" "), "dg-constrained dg-new dg-settled", "classes by state name");
    assertEq(r.colour, "rgb(200, 120, 255)", "the constrained colour from the start event");
  });

  await check("a remote engine's unknown readings: its own state colour, and '?' for the committed share", async () => {
    const r = await page.evaluate(async () => {
      const aux = createCanvasView(document.getElementById("aux"));
      aux.start({ node: "x", blocks: 1, steps: null, canvas_length: null, states: ["noise", "new", "settled", "pinned",
        "constrained", "unknown"], palette: { unknown: "#cd8296" } });
      aux.step({ node: "x", block: 0, step: 17, blocks: 1, steps: null, t: null, T: null, committed: null,
        caption: "block 1/≤1  step 18/≤?  T ?  committed ?  argmax canvas", tokens: ["seven", "<turn|>"], state: "55" });
      await frames2();
      const live = aux.element.querySelector(".dg-header").textContent;
      aux.done({ node: "x", status: "done", steps_used: 18, text: "seven", paused: false });
      await frames2();
      const spans = [...aux.element.querySelectorAll(".dg-canvas > span")];
      const out = { live, done: aux.element.querySelector(".dg-header").textContent,
        classes: spans.map((s) => s.className), colour: getComputedStyle(spans[0]).color };
      aux.destroy();
      return out;
    });
    assertEq(r.live, "block 1/≤1  step 18/≤?  T ?  committed ?  argmax canvas", "the caption says what is unknown");
    assertEq(r.done, "done, 18 steps · committed ?", "an unknown committed share is never 0%");
    assertEq(r.classes.join(" "), "dg-unknown dg-unknown", "classes by state name");
    assertEq(r.colour, "rgb(205, 130, 150)", "the unknown colour from the start event");
  });

  await check("the view says what was asked: the prompt, the image's thumbnail, never a foreign URL", async () => {
    const red = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
    const r = await page.evaluate(async ({ red }) => {
      const aux = createCanvasView(document.getElementById("aux"));
      const read = () => {
        const a = aux.element.querySelector(".dg-asked");
        const img = a.querySelector("img");
        return { hidden: a.hidden, text: a.textContent, img: img.hidden ? null : img.getAttribute("src") };
      };
      const idle = read();
      aux.start({ node: "x", blocks: 1, steps: 1, canvas_length: 1, asked: { prompt: "What colour <b>is</b> this?",
        thumbnail: red } });
      const shown = read();
      aux.start({ node: "x", blocks: 1, steps: 1, canvas_length: 1, asked: { prompt: "hi",
        thumbnail: "x\" onerror=\"window.__pwned=3" } });
      const evil = read();
      aux.start({ node: "x", blocks: 1, steps: 1, canvas_length: 1 });
      const none = read();
      aux.destroy();
      return { idle, shown, evil, none, pwned: window.__pwned };
    }, { red });
    assert(r.idle.hidden && r.none.hidden, "no asked line without a start that says what was asked");
    assertEq(r.shown.text, "asked: What colour <b>is</b> this?", "the prompt, as literal text");
    assertEq(r.shown.img, `data:image/png;base64,${red}`, "the thumbnail");
    assertEq(r.evil.img, null, "a thumbnail that is not base64 is not shown");
    assertEq(r.pwned, undefined, "window.__pwned");
  });

  await check("(d) 500 steps over 5 blocks: bounded DOM, coalesced paints, right text", async () => {
    const base = STEPS.slice(0, 12);
    const blocks = 5, per = 100;
    const many = [];
    for (let b = 0; b < blocks; b++) {
      for (let s = 0; s < per; s++) {
        const src = base[(b * per + s) % base.length];
        many.push({ ...src, block: b, step: s, blocks, steps: per, caption: `block ${b + 1}/≤${blocks}  step ${s + 1}/≤${per}`,
          tokens: src.tokens.map((t, i) => (i === 0 ? `[${b}.${s}]` : t)) });
      }
    }
    const start = { ...START, blocks, steps: per };
    const r = await page.evaluate(async ({ start, many }) => {
      const docNodes0 = document.getElementsByTagName("*").length;
      view.start(start);
      const paints0 = view.stats().paints;
      const nodeCounts = [];
      const t0 = performance.now();
      // Paced: 10 events per animation frame, as a fast run would arrive.
      for (let i = 0; i < many.length; i += 10) {
        for (const ev of many.slice(i, i + 10)) view.step(ev);
        await new Promise((r) => requestAnimationFrame(r));
        nodeCounts.push(view.element.getElementsByTagName("*").length);
      }
      await frames2();
      const paced = performance.now() - t0;
      const pacedPaints = view.stats().paints - paints0;
      // Burst: all 500 again within one task; expect a paint or two, not 500.
      view.start(start);
      const p1 = view.stats().paints;
      const t1 = performance.now();
      for (const ev of many) view.step(ev);
      const burstFeed = performance.now() - t1;
      await frames2();
      return { docNodes0, docNodes1: document.getElementsByTagName("*").length, nodeCounts,
        paced, pacedPaints, burstPaints: view.stats().paints - p1, burstFeed, ...painted(view) };
    }, { start, many });
    assertEq(r.spans, L, "span count");
    const maxNodes = Math.max(...r.nodeCounts), minNodes = Math.min(...r.nodeCounts);
    assertEq(maxNodes, minNodes, `view element count varies over the run (${minNodes}..${maxNodes})`);
    assert(maxNodes <= L + 8, `view holds ${maxNodes} elements for a ${L}-position canvas`);
    assertEq(r.docNodes1, r.docNodes0, "document element count after 500 steps");
    assert(r.pacedPaints <= r.nodeCounts.length + 2, `paced: ${r.pacedPaints} paints for ${r.nodeCounts.length} frames`);
    assert(r.burstPaints <= 2, `burst: ${r.burstPaints} paints for 500 events`);
    assertEq(r.text, expectedText(many), "painted text after 500 steps");
    assert(r.header.startsWith(`block ${blocks}/≤${blocks}  step ${per}/≤${per}`), `header: ${r.header}`);
    assert(r.paced < 15000, `500 paced steps took ${r.paced.toFixed(0)} ms`);
    console.log(`     500 steps: paced ${r.paced.toFixed(0)} ms in ${r.pacedPaints} paints, `
      + `burst feed ${r.burstFeed.toFixed(1)} ms in ${r.burstPaints} paint(s), ${maxNodes} elements`);
    await page.screenshot({ path: path.join(shotDir, "4-after-500-steps.png") });
  });

  await check("a list run paints one row per item: its own text, step, committed share and end", async () => {
    const half = Math.floor(B_STEPS.length / 2);
    const rowsOf = () => page.evaluate(async () => {
      await frames2();
      view.flush();
      return { header: view.element.querySelector(".dg-header").textContent, text: view.text(),
        rows: view.rows().map((r) => ({ text: r.text(), header: r.element.querySelector(".dg-header").textContent })) };
    });
    await page.evaluate((events) => feed(view, events), BATCH.slice(0, 1 + half));
    const mid = await rowsOf();
    assertEq(mid.rows.length, B_START.items, "rows");
    const settledMid = B_STEPS.slice(0, half).flatMap((s) => Object.keys(s.settled)); // each step tells the newly settled
    const working = [...Array(B_START.items).keys()].filter((i) => B_STEPS.slice(0, half).some((s) => s.item === i)
      && !settledMid.includes(String(i))).length;
    assertEq(mid.header, `${working} of ${B_START.items} items denoising together · ${settledMid.length} settled`,
      "list header mid-run");
    mid.rows.forEach((row, i) => {
      const own = B_STEPS.slice(0, half).filter((s) => s.item === i);
      assertEq(row.text, own.length ? expectedText(own) : "", `row ${i} text mid-run`);
      assert(row.header.startsWith(own.length ? `item ${i + 1} · ` : `item ${i + 1} · waiting for its batch`),
        `row ${i} header: ${row.header}`);
      if (own.length && !settledMid.includes(String(i))) {
        const lastOwn = own[own.length - 1];
        assertEq(row.header, `item ${i + 1} · committed ${Math.round(lastOwn.committed * 100)}% · block `
          + `${lastOwn.block + 1}/${lastOwn.blocks} · step ${lastOwn.step + 1}/${lastOwn.steps}`, `row ${i} header`);
      }
    });
    await page.screenshot({ path: path.join(shotDir, "5-list-run-mid.png") });
    await page.evaluate((events) => feed(view, events), BATCH.slice(1 + half));
    const end = await rowsOf();
    assertEq(end.header, `done · ${B_START.items} items settled, ${B_DONE.steps_used} steps`, "list header at the end");
    end.rows.forEach((row, i) => {
      assertEq(row.text, expectedText(B_STEPS.filter((s) => s.item === i)), `row ${i} text`);
      assert(row.header.startsWith(`item ${i + 1} · done, ${B_DONE.items[i].steps_used} steps`), `row ${i}: ${row.header}`);
    });
    await page.screenshot({ path: path.join(shotDir, "6-list-run-done.png") });
    const restored = await page.evaluate(async () => {
      const aux = createCanvasView(document.getElementById("aux"));
      aux.restore(view.snapshot());
      await frames2(); aux.flush();
      const out = { text: aux.text(), rows: aux.rows().length };
      aux.destroy();
      return out;
    });
    assertEq(restored.rows, B_START.items, "rows after a restore");
    assertEq(restored.text, end.text, "text after a restore");
    const single = await page.evaluate(async (events) => { feed(view, events); await frames2(); view.flush();
      return { rows: view.rows().length, ...painted(view) }; }, EVENTS);
    assertEq(single.rows, 0, "a single run after a list run has no rows");
    assertEq(single.text, expectedText(STEPS), "a single run's text after a list run");
  });

  await check("glue: live_view.js adds one view per DGemma node and routes events by node id", async () => {
    const r = await page.evaluate(async ({ start, step, done }) => {
      const { app, FakeNode } = await import("/scripts/app.js");
      const { api } = await import("/scripts/api.js");
      await import("/web/live_view.js");
      const ext = app.extensions.find((e) => e.name === "DiffusionGemma.LiveView");
      if (!ext) return { error: "extension not registered" };
      ext.setup?.(app);
      const host = document.createElement("div");
      host.style.cssText = "width:720px;height:160px";
      document.body.appendChild(host);
      const make = (cls, id, graph) => {
        const n = new FakeNode(cls, id, host);
        ext.nodeCreated(n, app); // node.id is still -1 here, as in ComfyUI
        n.id = id;
        graph.add(n);
        return n;
      };
      const a = make("DGemmaSampler", 7, app.rootGraph);
      const b = make("DGemmaDenoise", 8, app.rootGraph);
      const other = make("KSampler", 9, app.rootGraph);
      const sub = make("Subgraph", 12, app.rootGraph);
      sub.subgraph = new app.rootGraph.constructor();
      const inner = make("DGemmaSampler", 7, sub.subgraph);
      const send = (type, detail) => api.dispatchEvent(new CustomEvent(type, { detail }));
      send("dgemma.start", { ...start, node: "7" });
      send("dgemma.step", { ...step, node: "7" });
      send("dgemma.done", { ...done, node: "7" });
      send("dgemma.start", { ...start, node: "12:7" });
      send("dgemma.step", { ...step, node: "12:7", tokens: step.tokens.map(() => "z") });
      send("dgemma.step", { ...step, node: "99" }); // unknown node: ignored
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      const text = (n) => n.widgets[0]?.element.querySelector(".dg-body")?.textContent;
      return {
        widgets: [a, b, other, inner].map((n) => n.widgets.length),
        serialize: a.widgets[0].serialize, optSerialize: a.widgets[0].options.serialize,
        minHeight: a.widgets[0].options.getMinHeight?.(),
        a: text(a), b: text(b), inner: text(inner),
        header: a.widgets[0].element.querySelector(".dg-header").textContent,
      };
    }, { start: START, step: STEPS[3], done: DONE });
    assert(!r.error, r.error);
    assertEq(JSON.stringify(r.widgets), "[1,1,0,1]", "widgets per node (sampler, denoise, KSampler, inner)");
    assertEq(r.serialize, false, "widget.serialize");
    assertEq(r.optSerialize, false, "widget options.serialize");
    assert(r.minHeight >= 100, `min height ${r.minHeight}`);
    assertEq(r.a, join(STEPS[3].tokens), "node 7 text");
    assertEq(r.b, "", "node 8 text (no events for it)");
    assertEq(r.inner, "z".repeat(L), "subgraph node 12:7 text");
    assert(r.header.includes("done"), `node 7 header: ${r.header}`);
  });

  await check("glue: a list run grows its node to show every row", async () => {
    const r = await page.evaluate(async ({ start, step }) => {
      const { api } = await import("/scripts/api.js");
      const n = await glueNode("DGemmaSampler", 41);
      const before = n.size[1];
      api.dispatchEvent(new CustomEvent("dgemma.start", { detail: { ...start, node: "41" } }));
      api.dispatchEvent(new CustomEvent("dgemma.step", { detail: { ...step, node: "41" } }));
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      const { ROW_PX } = await import("/web/canvas_view.js");
      return { before, after: n.size[1], rows: n.widgets[0].element.querySelectorAll(".dg-row").length, ROW_PX };
    }, { start: B_START, step: B_STEPS[0] });
    assertEq(r.rows, B_START.items, "rows in the node");
    assertEq(r.after, Math.min(r.before + (B_START.items - 1) * r.ROW_PX, 100 + 480),
      `node height ${r.before} -> ${r.after}`);
  });

  await check("a list's items past the running batch wait, and the header counts only the batch", async () => {
    const r = await page.evaluate(async ({ start, step }) => {
      const box = document.createElement("div");
      document.body.appendChild(box);
      const v = createCanvasView(box);
      v.start({ ...start, items: 3, rows: [0, 1, 2].map((i) => start.rows[i % start.rows.length]) });
      v.step({ ...step, item: 0, settled: {} });
      await frames2();
      v.flush();
      return { header: v.element.querySelector(".dg-header").textContent,
        rows: v.rows().map((row) => row.element.querySelector(".dg-header").textContent) };
    }, { start: B_START, step: B_STEPS[0] });
    assertEq(r.header, "1 of 3 items denoising together · 0 settled", "list header");
    assertEq(r.rows[1], "item 2 · waiting for its batch", "a waiting row");
    assertEq(r.rows[2], "item 3 · waiting for its batch", "a waiting row");
    assert(r.rows[0].startsWith("item 1 · committed"), `the working row: ${r.rows[0]}`);
  });

  await check("glue: a long list shows more than five rows in a 460 px view, each readable, one scroll for all",
    async () => {
      const r = await page.evaluate(async ({ start, steps }) => {
        const { api } = await import("/scripts/api.js");
        const { ROW_PX } = await import("/web/canvas_view.js");
        const n = await glueNode("DGemmaSampler", 42);
        const rows = Array.from({ length: 40 }, (_, i) => start.rows[i % start.rows.length]);
        api.dispatchEvent(new CustomEvent("dgemma.start", { detail: { ...start, items: 40, rows, node: "42" } }));
        for (let i = 0; i < 40; i++) {  // every row holds a long text, more than its line shows
          api.dispatchEvent(new CustomEvent("dgemma.step", { detail: { ...steps[steps.length - 1], item: i,
            settled: {}, node: "42", tokens: Array(200).fill("word ") } }));
        }
        const box = n.widgets[0].element;
        box.style.height = "460px";
        box.scrollIntoView();  // rows out of the page's sight are not laid out (content-visibility)
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        const body = box.querySelector(".dg-body");
        const bottom = body.getBoundingClientRect().top + body.clientHeight;
        const all = [...body.querySelectorAll(".dg-row")];
        const seen = all.filter((row) => row.getBoundingClientRect().bottom <= bottom + 0.5);
        const inner = all.map((row) => row.querySelector(".dg-body"));
        return { heights: all.map((row) => row.getBoundingClientRect().height), ROW_PX, seen: seen.length,
          scrolls: body.scrollHeight > body.clientHeight,
          rowScrolls: inner.filter((b) => getComputedStyle(b).overflowY !== "hidden").length,
          texts: seen.filter((row) => row.querySelector(".dg-body").clientHeight >= 14).length,
          filled: all.filter((row) => row.querySelector(".dg-body").textContent.length > 0).length };
      }, { start: B_START, steps: B_STEPS });
      await page.locator(".dgemma-view:has(> .dg-body > .dg-rows)").last()
        .screenshot({ path: path.join(shotDir, "7-long-list.png") });
      assertEq(r.heights.length, 40, "rows");
      assert(Math.min(...r.heights) >= r.ROW_PX, `row heights ${Math.min(...r.heights)} .. ${Math.max(...r.heights)}`);
      assert(r.seen > 5, `rows in sight in a 460 px view: ${r.seen}`);
      assert(r.scrolls, "the rows scroll inside the view");
      assertEq(r.rowScrolls, 0, "rows that scroll on their own");
      assertEq(r.texts, r.seen, "rows in sight showing a line of their text");
      assertEq(r.filled, 40, "rows holding their text");
    });

  await check("glue: a run's state is saved once per animation frame, and kept when its tab closes at once",
    async () => {
      const r = await page.evaluate(async ({ start, steps }) => {
        const { api } = await import("/scripts/api.js");
        const { glueStats } = await import("/web/live_view.js");
        const n = await glueNode("DGemmaSampler", 43);
        await frames2();
        const before = glueStats.saves;
        const send = (type, detail) => api.dispatchEvent(new CustomEvent(type, { detail: { ...detail, node: "43" } }));
        send("dgemma.start", start);
        for (let k = 0; k < 100; k++) send("dgemma.step", { ...steps[k % steps.length], settled: {} });
        await frames2();
        const perFrame = glueStats.saves - before;
        send("dgemma.step", { ...steps[0], settled: {} });
        n.onRemoved?.();  // the tab closes before the next frame
        const saved = glueStats.saves - before - perFrame;
        await frames2();
        return { perFrame, saved, after: glueStats.saves - before - perFrame - saved };
      }, { start: B_START, steps: B_STEPS });
      assertEq(r.perFrame, 1, "saves for 101 events within one frame");
      assertEq(r.saved, 1, "saves when the node is removed before its frame");
      assertEq(r.after, 0, "saves left for the frame after the node was removed");
    });

  await check("a workflow tab switch keeps each node's last run", async () => {
    const r = await page.evaluate(async ({ start, step, done }) => {
      const { app } = await import("/scripts/app.js");
      const { api } = await import("/scripts/api.js");
      const before = await glueNode("DGemmaSamplerAdvanced", 31);
      const send = (type, detail) => api.dispatchEvent(new CustomEvent(type, { detail }));
      send("dgemma.start", { ...start, node: "31" });
      send("dgemma.step", { ...step, node: "31" });
      send("dgemma.done", { ...done, node: "31", paused: true });
      before.onRemoved?.(); // switching tabs removes the nodes; coming back makes new ones
      app.rootGraph.remove?.(before);
      const after = await glueNode("DGemmaSamplerAdvanced", 31);
      await new Promise((r) => setTimeout(r, 20));
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      const el = after.widgets[0].element;
      return { text: el.querySelector(".dg-body")?.textContent, header: el.querySelector(".dg-header").textContent,
               title: el.querySelector(".dg-header").title };
    }, { start: START, step: STEPS[3], done: DONE });
    assertEq(r.text, join(STEPS[3].tokens), "text after the tab came back");
    assert(r.header.startsWith(`paused · committed ${Math.round(STEPS[3].committed * 100)}%`), `header: ${r.header}`);
    assertEq(r.title, r.header, "the header's whole line on hover");
  });

  await check("the Advanced node shows only the knobs its scheduler reads, and keeps every value", async () => {
    const r = await page.evaluate(async (applies) => {
      const { app } = await import("/scripts/app.js");
      const { followScheduler } = await import("/web/scheduler_widgets.js");
      const ext = app.extensions.find((e) => e.name === "DiffusionGemma.SchedulerWidgets");
      const names = ["seed", "t_min", "t_max", "entropy_bound", "scheduler", "temperature", "threshold",
                     "editing_threshold", "corrector_steps", "corrector_k"];
      const node = { widgets: names.map((name) => ({ name, type: "number", value: name === "scheduler"
        ? "entropy_bound" : 1 })), size: [300, 200], computeSize: () => [300, 150], setSize(s) { this.size = s; } };
      const shown = () => node.widgets.filter((w) => !w.hidden).map((w) => w.name).join(",");
      followScheduler(node, applies);
      const first = shown();
      const sched = node.widgets.find((w) => w.name === "scheduler");
      sched.value = "discrete_ddim"; sched.callback?.("discrete_ddim");
      const ddim = shown();
      sched.value = "block_refinement"; node.onConfigure?.({}); // a saved graph's value, set after creation
      const loaded = shown();
      const proto = {};
      ext.beforeRegisterNodeDef({ prototype: proto }, { input: { required: { scheduler: [[], { dgemma_applies: applies }] } } });
      return { registered: Boolean(ext) && typeof proto.onNodeCreated === "function", first, ddim, loaded,
               values: node.widgets.map((w) => w.value).join(","), type: node.widgets[5].type };
    }, { entropy_bound: ["t_min", "t_max", "entropy_bound"],
         block_refinement: ["temperature", "threshold", "editing_threshold"],
         discrete_ddim: ["temperature", "corrector_steps", "corrector_k"] });
    assert(r.registered, "extension registered and hooks onNodeCreated");
    assertEq(r.first, "seed,t_min,t_max,entropy_bound,scheduler", "entropy_bound shows");
    assertEq(r.ddim, "seed,scheduler,temperature,corrector_steps,corrector_k", "discrete_ddim shows");
    assertEq(r.loaded, "seed,scheduler,temperature,threshold,editing_threshold", "a loaded graph shows");
    assertEq(r.values, "1,1,1,1,block_refinement,1,1,1,1,1", "every value kept");
    assertEq(r.type, "number", "a shown widget gets its type back");
  });

  await check("no page errors or console errors", async () => {
    assertEq(pageErrors.length, 0, `page errors: ${pageErrors.join(" | ")}`);
    assertEq(consoleErrors.length, 0, `console errors: ${consoleErrors.join(" | ")}`);
  });
} catch (err) {
  console.error(`page failed: ${err.stack || err}`);
  failed = failed || -1;
} finally {
  await context.close().catch(() => {});
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}

console.log(`screenshots: ${shotDir}`);
console.log(`${results.filter((r) => r.startsWith("ok")).length} passed, ${failed > 0 ? failed : 0} failed `
  + `in ${((Date.now() - t0) / 1000).toFixed(1)} s (${STEPS.length} recorded steps, canvas ${L}, fixture ${recorded.source})`);
process.exit(failed === -1 ? 2 : failed ? 1 : 0);
