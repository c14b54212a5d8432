// Retake a template's thumbnail from a real run in a ComfyUI page (1600x1000): load the template as saved,
// press Run, wait for the run to end, save the whole page (OUT.png) and, given a region, a JPEG of it (OUT.jpg).
// Usage: node retake_thumbnail.mjs URL TEMPLATE.json OUT.jpg [X,Y,W,H]
// Start ComfyUI with --cache-none, so every template really runs instead of reusing a cached output.
import path from "node:path";
import { loadTemplate, openComfy } from "./comfy_page.mjs";

const [url, template, out, region] = process.argv.slice(2);
const { ctx, page } = await openComfy(url);
try {
  await loadTemplate(page, template, path.basename(template, ".json"));
  const ended = page.evaluate(() => new Promise((resolve) => {
    for (const kind of ["execution_success", "execution_error", "execution_interrupted"]) {
      window.app.api.addEventListener(kind, () => resolve(kind));
    }
  }));
  await page.evaluate(() => window.app.queuePrompt(0, 1));
  const outcome = await Promise.race([ended, new Promise((r) => setTimeout(() => r("timeout"), 400000).unref())]);
  await page.waitForTimeout(3000); // the GIF preview and the live view's last paint
  await page.screenshot({ path: out.replace(/\.jpg$/, ".png") });
  // A GIF preview loops: SHOTS=n also saves n pages 0.2 s apart (OUT-1.png ...) to pick its last frame from.
  for (let i = 1; i <= Number(process.env.SHOTS || 0); i++) {
    await page.screenshot({ path: out.replace(/\.jpg$/, `-${i}.png`) });
    await page.waitForTimeout(200);
  }
  if (region) {
    const [x, y, width, height] = region.split(",").map(Number);
    await page.screenshot({ path: out, type: "jpeg", quality: 88, clip: { x, y, width, height } });
  }
  console.log(JSON.stringify({ template: path.basename(template), outcome }));
  if (outcome !== "execution_success") process.exitCode = 1;
} finally {
  await ctx.close();
}
