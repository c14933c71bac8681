// The README's TensorBoard picture of the straggler demo, taken from a real TensorBoard.
// Needs Chromium (Debian: apt-get install chromium) and playwright-core (npm install playwright-core):
//   CONFIG_FILE=train_configs/straggler_demo_cpu.toml ./run_train.sh --job.dump_folder outputs/straggler_demo/readme
//   .venv/bin/tensorboard --logdir outputs/straggler_demo/readme --port 6123 &
//   node scripts/tensorboard_screenshot.js docs/figures/straggler_demo_tensorboard.png [http://localhost:6123]
const { chromium } = require('playwright-core');

const TAGS = 'morph/(pipeline_ms|delay_ms/link2|straggling/link2|delegated/link2)$';

(async () => {
  const [out, url = 'http://localhost:6123'] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--use-gl=swiftshader', '--enable-unsafe-swiftshader'],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 960 } });
  await page.goto(`${url}/#timeseries`, { waitUntil: 'networkidle' });
  await page.waitForTimeout(3000);
  // raw values: no smoothing, no outlier clipping (settings pane, open on a first visit), then close the pane
  const smoothing = page.locator('input.slider-input, input[aria-label*="moothing"]').first();
  await smoothing.fill('0');
  await smoothing.press('Enter');
  const outliers = page.locator('mat-checkbox:has-text("Ignore outliers") input');
  if (await outliers.isChecked()) await outliers.click({ force: true });
  await page.mouse.click(1363, 134);
  const filter = page.locator('input[placeholder="Filter tags (regex)"]');
  await filter.fill(TAGS);
  await filter.press('Escape');
  await page.mouse.click(700, 20);
  await page.waitForTimeout(4000);
  await page.screenshot({ path: out });
  await browser.close();
})();
