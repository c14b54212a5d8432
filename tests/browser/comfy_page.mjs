// A real ComfyUI page for the hand-check scripts: a fresh headless Chromium profile, the page loaded
// until its app and canvas exist (the tutorial dismissed first), and a template loaded into it.
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export async function openComfy(url, viewport = { width: 1600, height: 1000 }) {
  const { chromium } = createRequire(import.meta.url)("playwright-core");
  await fetch(url + "/api/settings/Comfy.TutorialCompleted", { method: "POST", body: "true",
    headers: { "Content-Type": "application/json" } }).catch(() => {});
  const ctx = await chromium.launchPersistentContext(fs.mkdtempSync(path.join(os.tmpdir(), "comfy-page-")), {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true, viewport,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"] });
  const page = ctx.pages()[0] || await ctx.newPage();
  try {
    await page.goto(url, { waitUntil: "domcontentloaded", timeout: 120000 });
    await page.waitForFunction(() => window.app?.graph && document.querySelector("canvas"), null, { timeout: 120000 });
    await page.waitForTimeout(3000);
  } catch (err) {
    await ctx.close();
    throw err;
  }
  return { ctx, page };
}

/** Load a UI-format template file into the page as a workflow tab named `name`. */
export async function loadTemplate(page, file, name = "template") {
  const data = JSON.parse(fs.readFileSync(file, "utf8"));
  await page.evaluate(async ([d, n]) => { await window.app.loadGraphData(d, true, true, n); }, [data, name]);
  await page.waitForTimeout(2000);
}
