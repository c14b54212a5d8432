// Hand check in a real ComfyUI page: load a template, run it, switch to a blank workflow tab and back,
// and screenshot each stage. Usage: node hand_check_tabs.mjs URL TEMPLATE.json OUT_DIR
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [url, template, out] = process.argv.slice(2);
const { chromium } = createRequire(import.meta.url)("playwright-core");
await fetch(url + "/api/settings/Comfy.TutorialCompleted", { method: "POST", body: "true",
  headers: { "Content-Type": "application/json" } }).catch(() => {});
const ctx = await chromium.launchPersistentContext(fs.mkdtempSync(path.join(os.tmpdir(), "hc-")), {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true, viewport: { width: 1600, height: 1000 },
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"] });
const page = ctx.pages()[0] || await ctx.newPage();
const log = [];
page.on("pageerror", (e) => log.push("pageerror " + e));
const shot = (name) => page.screenshot({ path: path.join(out, name) });
try {
  await page.goto(url, { waitUntil: "domcontentloaded", timeout: 120000 });
  await page.waitForFunction(() => window.app?.graph && document.querySelector("canvas"), null, { timeout: 120000 });
  await page.waitForTimeout(3000);
  const data = JSON.parse(fs.readFileSync(template, "utf8"));
  await page.evaluate(async (d) => { await window.app.loadGraphData(d, true, true, "template"); }, data);
  await page.waitForTimeout(2000);
  await shot("1-template-loaded.png");
  await page.evaluate(() => { // a fresh seed: an identical prompt would come from ComfyUI's cache, with no run
    for (const n of window.app.graph._nodes) {
      const w = n.widgets?.find((x) => x.name === "seed");
      if (w && String(n.comfyClass).startsWith("DGemma")) w.value = 1 + Math.floor(Math.random() * 1e6);
    }
  });
  await page.evaluate(() => window.app.queuePrompt(0, 1));
  await page.waitForFunction(() => [...document.querySelectorAll(".dg-header")].some((h) => /^done|^paused/.test(h.textContent)),
    null, { timeout: 400000 });
  await page.waitForTimeout(1500);
  await shot("2-after-run.png");
  const headerBefore = await page.evaluate(() => [...document.querySelectorAll(".dg-header")].map((h) => h.textContent));
  const wf = await page.evaluate(async () => {
    const store = window.app.extensionManager.workflow;
    const first = store.activeWorkflow;
    await window.app.extensionManager.command.execute("Comfy.NewBlankWorkflow");
    await new Promise((r) => setTimeout(r, 1500));
    const blank = store.activeWorkflow?.key;
    return { first: first?.key, blank };
  });
  await shot("2b-blank-tab.png");
  await page.getByText("template", { exact: true }).first().click(); // the template's workflow tab
  await page.waitForTimeout(2500);
  wf.back = await page.evaluate(() => window.app.extensionManager.workflow.activeWorkflow?.key);
  await page.waitForTimeout(1500);
  await shot("3-after-tab-switch.png");
  const headerAfter = await page.evaluate(() => [...document.querySelectorAll(".dg-header")].map((h) => h.textContent));
  console.log(JSON.stringify({ wf, headerBefore, headerAfter, log }, null, 1));
} finally {
  await ctx.close();
}
