// A page on another origin against `python -m serve`, in real Chromium: what a hostile site can do to
// a server on loopback. Run by tests/test_live_view_browser.py, which starts the servers and checks
// on them afterwards:
//
//   node csrf.test.mjs <server url> <server allowing the page's origin> <page port>
//
// The page is served from 127.0.0.1:<page port> (another origin). It tries simple requests (text/plain,
// a form post: sent without a preflight), a JSON request (preflighted) and reads; then the browser
// visits the server under a rebound name (attacker.example mapped to 127.0.0.1, as DNS rebinding
// would) and as localhost. Prints one line `RESULT {json}`. Exit codes: 0 done, 2 the browser
// failed, 3 a dependency is missing.

import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--host-resolver-rules=MAP attacker.example 127.0.0.1"];
const [SERVER, OPEN_SERVER, PAGE_PORT] = process.argv.slice(2);

let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (err) {
  console.error(`MISSING playwright-core: ${err.message}`);
  process.exit(3);
}

const PAGE = "<!doctype html><title>elsewhere</title><iframe name=sink></iframe>";
const pages = http.createServer((req, res) => {
  res.writeHead(200, { "content-type": "text/html" }).end(PAGE);
});
await new Promise((resolve) => pages.listen(Number(PAGE_PORT), "127.0.0.1", resolve));

/** In the page: every way a site may try to use the server; each says what the page got back. */
async function attack({ server, run }) {
  const tryFetch = async (url, init) => {
    try {
      const r = await fetch(url, init);
      let body = null;
      try { body = await r.text(); } catch (err) { body = `unreadable: ${err}`; }
      return { type: r.type, status: r.status, body: body.slice(0, 2000) };
    } catch (err) {
      return { error: String(err).slice(0, 100) };
    }
  };
  const text = { method: "POST", headers: { "Content-Type": "text/plain" }, body: JSON.stringify(run) };
  const out = {
    plainChat: await tryFetch(`${server}/v1/chat/completions`, text),
    plainChatNoCors: await tryFetch(`${server}/v1/chat/completions`, { ...text, mode: "no-cors" }),
    plainContexts: await tryFetch(`${server}/v1/dgemma/contexts`, { ...text, mode: "no-cors",
      body: JSON.stringify({ text: "planted" }) }),
    formContexts: await tryFetch(`${server}/v1/dgemma/contexts`, { method: "POST", mode: "no-cors",
      headers: { "Content-Type": "application/x-www-form-urlencoded" }, body: "text=planted" }),
    jsonChat: await tryFetch(`${server}/v1/chat/completions`, { method: "POST",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(run) }),
    readModels: await tryFetch(`${server}/v1/models`, {}),
  };
  const form = document.createElement("form");  // a plain HTML form post: no script needed at all
  form.method = "POST";
  form.enctype = "text/plain";
  form.target = "sink";
  form.action = `${server}/v1/chat/completions`;
  const field = document.createElement("input");
  field.name = JSON.stringify(run).slice(0, -1) + ', "x": "';
  field.value = '"}';
  form.appendChild(field);
  document.body.appendChild(form);
  const loaded = new Promise((resolve) => { document.querySelector("iframe").onload = resolve; });
  form.submit();
  await Promise.race([loaded, new Promise((resolve) => setTimeout(resolve, 5000))]);
  return out;
}

async function visit(page, url) {
  try {
    const response = await page.goto(url, { timeout: 15000 });
    return { status: response.status(), body: (await response.text()).slice(0, 300) };
  } catch (err) {
    return { error: String(err.message).split("\n")[0].slice(0, 200) };
  }
}

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "dgemma-csrf-"));
let context;
try {
  context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: FLAGS });
} catch (err) {
  console.error(`browser failed to start: ${err.message}`);
  pages.close();
  process.exit(2);
}
const result = {};
try {
  const page = context.pages()[0] || await context.newPage();
  const run = { messages: [{ role: "user", content: "What is 3+4?" }], max_tokens: 32 };
  await page.goto(`http://127.0.0.1:${PAGE_PORT}/`);
  result.attacks = await page.evaluate(attack, { server: SERVER, run });
  result.allowed = await page.evaluate(attack, { server: OPEN_SERVER, run });
  const port = new URL(SERVER).port;
  result.rebound = await visit(page, `http://attacker.example:${port}/v1/models`);
  result.reboundHealth = await visit(page, `http://attacker.example:${port}/health`);
  result.localhost = await visit(page, `http://localhost:${port}/health`);
} finally {
  await context.close();
  pages.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(`RESULT ${JSON.stringify(result)}`);
