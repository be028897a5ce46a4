"""The minimal gpuprof tab, served as /index.js until tb_gpuprof/static/index.js exists.

Kept as a Python string so it ships with the package whatever the package data settings.
It lists runs and their top-10 kernels; text goes in through textContent only.
"""

FALLBACK_MODULE = r"""// Minimal gpuprof tab. Never innerHTML: kernel names contain '<' and '>'.
const base = new URL('./', import.meta.url);

async function getJson(path) {
  const response = await fetch(new URL(path, base));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function el(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function kernelTable(kernels) {
  const table = el('table');
  const head = el('tr');
  for (const h of ['kernel', 'calls', 'total (us)', '% GPU', 'Tensor Cores']) {
    head.append(el('th', h));
  }
  table.append(head);
  for (const k of kernels) {
    const row = el('tr');
    row.append(el('td', k.name), el('td', k.count), el('td', Number(k.total_us).toFixed(1)),
               el('td', k.pct == null ? '' : Number(k.pct).toFixed(1)),
               el('td', k.uses_tensor_cores ? 'yes' : 'no'));
    table.append(row);
  }
  return table;
}

export async function render() {
  const root = el('div');
  root.style.fontFamily = 'sans-serif';
  root.style.padding = '16px';
  document.body.append(root);
  root.append(el('h2', 'GPU Prof'));
  let runs;
  try {
    runs = (await getJson('runs')).runs;
  } catch (e) {
    root.append(el('p', `cannot list runs: ${e.message}`));
    return;
  }
  if (runs.length === 0) root.append(el('p', 'No tb_gpuprof data in this log directory.'));
  for (const run of runs) {
    const section = el('section');
    section.append(el('h3', run.run));
    root.append(section);
    if (run.error) { section.append(el('p', `error: ${run.error}`)); continue; }
    if (run.reports.length === 0) {
      section.append(el('p', 'scalars only, no report yet'));
      continue;
    }
    try {
      const page = await getJson(`kernels?run=${encodeURIComponent(run.run)}&limit=10`);
      const shown = `top ${page.kernels.length} of ${page.total} kernels`;
      section.append(el('p', `step ${page.step}: ${shown}`));
      section.append(kernelTable(page.kernels));
    } catch (e) {
      section.append(el('p', `error: ${e.message}`));
    }
  }
}
"""
