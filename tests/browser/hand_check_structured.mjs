// Hand check in a real ComfyUI page: run the structured template and screenshot the live view during
// the run and after it. Usage: node hand_check_structured.mjs URL TEMPLATE.json OUT_DIR [STEPS]
// STEPS (optional) sets num_inference_steps with confidence 0 on every sampler, so a run on a fast
// CPU lasts long enough to be seen mid-run.
import path from "node:path";
import { loadTemplate, openComfy } from "./comfy_page.mjs";

const [url, template, out, steps] = process.argv.slice(2);
const { ctx, page } = await openComfy(url, { width: 1800, height: 1100 });
const log = [];
page.on("pageerror", (e) => log.push("pageerror " + e));
const shot = (name) => page.screenshot({ path: path.join(out, name) });
const headers = () => page.evaluate(() => [...document.querySelectorAll(".dg-header")].map((h) => h.textContent));
const stateCounts = () => page.evaluate(() => [...document.querySelectorAll(".dgemma-view")].map((v) => {
  const counts = {};
  for (const s of v.querySelectorAll(".dg-canvas span")) counts[s.className] = (counts[s.className] ?? 0) + 1;
  return counts;
}));
try {
  await loadTemplate(page, template);
  await page.evaluate((n) => { // a fresh seed, so ComfyUI's cache does not skip the run
    for (const node of window.app.graph._nodes) {
      if (!String(node.comfyClass).startsWith("DGemma")) continue;
      const set = (name, v) => { const w = node.widgets?.find((x) => x.name === name); if (w) w.value = v; };
      set("seed", 1 + Math.floor(Math.random() * 1e6));
      if (n) { set("num_inference_steps", n); set("confidence", 0); }
    }
  }, steps ? Number(steps) : 0);
  await shot("1-loaded.png");
  await page.evaluate(() => window.app.queuePrompt(0, 1));
  const during = [];
  for (const [i, f] of [0.02, 0.06, 0.25].entries()) { // early: noise, accepted and constrained side by side
    await page.waitForFunction((f) => [...document.querySelectorAll(".dg-header")] // past f of the steps
      .some((h) => { const m = /step (\d+)\/(\d+)/.exec(h.textContent); return m && Number(m[1]) > f * Number(m[2]); }),
    f, { timeout: 120000, polling: 20 }).catch(() => {});
    await shot(`2-during-${i}.png`);
    during.push({ headers: await headers(), states: await stateCounts() });
  }
  await page.waitForFunction(() => [...document.querySelectorAll(".dg-header")].filter((h) => /^done/.test(h.textContent))
    .length >= 2, null, { timeout: 400000 });
  await page.waitForTimeout(1500);
  await shot("3-after-run.png");
  console.log(JSON.stringify({ during, after: { headers: await headers(), states: await stateCounts() }, log }, null, 1));
} finally {
  await ctx.close();
}
