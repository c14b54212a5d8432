// Hand check in a real ComfyUI page: load a template, run it, switch to a blank workflow tab and back,
// and screenshot each stage. Usage: node hand_check_tabs.mjs URL TEMPLATE.json OUT_DIR
import path from "node:path";
import { loadTemplate, openComfy } from "./comfy_page.mjs";

const [url, template, out] = process.argv.slice(2);
const { ctx, page } = await openComfy(url);
const log = [];
page.on("pageerror", (e) => log.push("pageerror " + e));
const shot = (name) => page.screenshot({ path: path.join(out, name) });
try {
  await loadTemplate(page, template);
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
