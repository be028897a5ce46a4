// Styles, injected as one <style> element built with textContent (TensorBoard's CSP allows inline
// styles, not inline scripts). System/Roboto font stack like TensorBoard; no web fonts.
export const CSS = `
:root { color-scheme: light dark; }
.gp {
  --bg: #fff; --fg: #212121; --muted: #616161; --border: #e0e0e0; --panel: #fafafa;
  --accent: #f57c00; --link: #1976d2; --hover: #fff3e0; --code: #f5f5f5;
  --high: #c62828; --medium: #ef6c00; --low: #1976d2;
  font-family: Roboto, "Helvetica Neue", "Segoe UI", Arial, sans-serif; font-size: 14px;
  color: var(--fg); background: var(--bg); min-height: 100vh; box-sizing: border-box;
}
.gp.dark {
  --bg: #303030; --fg: #e8e8e8; --muted: #aaa; --border: #4a4a4a; --panel: #383838;
  --accent: #ff9800; --link: #64b5f6; --hover: #4a3a28; --code: #262626;
  --high: #ef5350; --medium: #ffa726; --low: #64b5f6;
}
body { margin: 0; background: #fff; }
body.gp-dark-body { background: #303030; }
.gp *, .gp *::before, .gp *::after { box-sizing: inherit; }
.gp header { display: flex; flex-wrap: wrap; align-items: center; gap: 12px; padding: 8px 16px;
  border-bottom: 1px solid var(--border); background: var(--panel); }
.gp header label { color: var(--muted); font-size: 13px; display: flex; gap: 6px; align-items: center; }
.gp select, .gp input[type=search], .gp button { font: inherit; font-size: 13px; color: var(--fg);
  background: var(--bg); border: 1px solid var(--border); border-radius: 4px; padding: 4px 8px; }
.gp button { cursor: pointer; }
.gp button:disabled { opacity: .5; cursor: default; }
.gp button.primary { background: var(--accent); color: #fff; border-color: var(--accent); }
.gp nav.tabs { display: flex; gap: 2px; margin-left: auto; }
.gp nav.tabs button { border: none; background: none; padding: 8px 12px; border-bottom: 2px solid transparent;
  border-radius: 0; text-transform: uppercase; font-size: 13px; letter-spacing: .03em; color: var(--muted); }
.gp nav.tabs button[aria-selected=true] { color: var(--accent); border-bottom-color: var(--accent); font-weight: 500; }
.gp main { padding: 16px; max-width: 1600px; }
.gp h2 { font-size: 16px; font-weight: 500; margin: 0 0 8px; }
.gp h3 { font-size: 14px; font-weight: 500; margin: 0 0 6px; }
.gp .muted { color: var(--muted); }
.gp .cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: 12px; margin-bottom: 16px; }
.gp .card { border: 1px solid var(--border); border-radius: 6px; padding: 10px 14px; background: var(--panel); }
.gp .card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.gp .card .value { font-size: 24px; font-weight: 500; margin: 4px 0 2px; }
.gp .card .sub { color: var(--muted); font-size: 12px; }
.gp .grid2 { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 16px; margin-bottom: 16px; }
.gp .panel { border: 1px solid var(--border); border-radius: 6px; padding: 12px 14px; margin-bottom: 16px; min-width: 0; }
.gp .chart { width: 100%; }
.gp .tablewrap { overflow-x: auto; }
.gp table { border-collapse: collapse; width: 100%; font-size: 13px; }
.gp th, .gp td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--border); white-space: nowrap; }
.gp th { color: var(--muted); font-weight: 500; position: sticky; top: 0; background: var(--bg); }
.gp th.sortable { cursor: pointer; user-select: none; }
.gp th.sortable:hover { color: var(--fg); }
.gp th[aria-sort=ascending]::after { content: " \\25B2"; font-size: 10px; }
.gp th[aria-sort=descending]::after { content: " \\25BC"; font-size: 10px; }
.gp td.num, .gp th.num { text-align: right; font-variant-numeric: tabular-nums; }
.gp tbody tr:hover { background: var(--hover); }
.gp .trunc { display: inline-block; max-width: 420px; overflow: hidden; text-overflow: ellipsis; vertical-align: bottom; }
.gp .trunc.narrow { max-width: 220px; }
.gp .mono { font-family: "Roboto Mono", Menlo, Consolas, monospace; font-size: 12px; }
.gp .badge { display: inline-block; padding: 1px 6px; border-radius: 10px; font-size: 11px; font-weight: 500;
  border: 1px solid currentColor; text-transform: uppercase; }
.gp .badge.high { color: var(--high); } .gp .badge.medium { color: var(--medium); } .gp .badge.low { color: var(--low); }
.gp .badge.tc { color: var(--accent); }
.gp .status-appeared { color: var(--medium); } .gp .status-vanished { color: var(--low); }
.gp .status-changed { color: var(--high); } .gp .status-same { color: var(--muted); }
.gp .error { border: 1px solid var(--high); color: var(--high); border-radius: 6px; padding: 10px 14px; margin: 8px 0 16px;
  background: transparent; white-space: pre-wrap; }
.gp .empty { color: var(--muted); padding: 24px; text-align: center; border: 1px dashed var(--border); border-radius: 6px; }
.gp .warn { color: var(--medium); }
.gp .notice { border: 1px solid var(--border); border-left: 4px solid var(--low); border-radius: 0 6px 6px 0;
  padding: 8px 14px; margin-bottom: 12px; background: var(--panel); }
.gp .verdict { border: 1px solid var(--border); border-left: 4px solid var(--accent); border-radius: 0 6px 6px 0;
  padding: 10px 14px; margin-bottom: 12px; background: var(--panel); }
.gp .verdict-text { font-size: 18px; font-weight: 500; margin-bottom: 8px; }
.gp .share-bar { display: flex; height: 14px; border-radius: 3px; overflow: hidden; background: var(--border); }
.gp .share-bar span { display: block; height: 100%; }
.gp .share-legend { display: flex; flex-wrap: wrap; gap: 12px; margin: 6px 0 2px; font-size: 12px; }
.gp .verdict-fix { margin-top: 6px; }
.gp .first-screen { display: grid; grid-template-columns: minmax(0, 1fr) minmax(300px, 420px); gap: 12px; margin-bottom: 12px; align-items: start; }
.gp .first-main { min-width: 0; }
.gp .first-main .verdict { margin-bottom: 8px; }
.gp .top-fix { border: 1px solid var(--border); border-left: 4px solid var(--high); border-radius: 0 6px 6px 0; padding: 10px 14px; background: var(--panel); margin-top: 0; }
.gp .top-fix strong { font-size: 15px; }
.gp .top-fix pre { max-height: 150px; overflow: auto; margin: 4px 0 6px; }
.gp .saving-strong { color: var(--high); font-weight: 500; }
.gp .small { font-size: 12px; }
.gp .key-cards { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
.gp .key-cards .card .value { font-size: 30px; }
.gp .small-cards .card .value { font-size: 18px; }
.gp .kernel-links { margin: 0; padding-left: 18px; }
.gp .kernel-links .trunc { max-width: 640px; white-space: nowrap; }
.gp .evidence-table { width: auto; font-size: 12px; }
.gp .evidence-table td, .gp .evidence-table th { padding: 2px 8px; }
.gp .tl-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 12px; margin-bottom: 6px; }
.gp .tl-body { display: flex; border: 1px solid var(--border); border-radius: 6px; margin-bottom: 12px; }
.gp .tl-labels { position: relative; flex: none; border-right: 1px solid var(--border); }
.gp .tl-label { position: absolute; left: 0; right: 0; padding: 0 6px; font-size: 11px; color: var(--muted);
  overflow: hidden; white-space: nowrap; text-overflow: ellipsis; border-top: 1px dotted var(--border); }
.gp .tl-canvas { flex: 1; min-width: 0; display: block; cursor: grab; }
.gp .wrap { word-break: break-all; }
@media (max-width: 900px) { .gp .first-screen { grid-template-columns: 1fr; } }
.gp .rec { border-left: 3px solid var(--accent); padding: 8px 12px; margin-bottom: 12px; background: var(--panel); border-radius: 0 6px 6px 0; }
.gp .rec.high { border-left-color: var(--high); } .gp .rec.low { border-left-color: var(--low); }
.gp .rec .head { display: flex; gap: 8px; align-items: baseline; flex-wrap: wrap; }
.gp .rec .saving { margin-left: auto; color: var(--muted); font-size: 13px; }
.gp .rec p { margin: 6px 0; }
.gp .subtabs { display: flex; gap: 4px; margin: 6px 0 0; }
.gp .subtabs button { padding: 2px 10px; font-size: 12px; }
.gp .subtabs button[aria-selected=true] { border-color: var(--accent); color: var(--accent); }
.gp pre { background: var(--code); padding: 8px 10px; border-radius: 4px; overflow-x: auto; margin: 4px 0 0;
  font-family: "Roboto Mono", Menlo, Consolas, monospace; font-size: 12px; white-space: pre; }
.gp dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; font-size: 13px; }
.gp dl.kv dt { color: var(--muted); } .gp dl.kv dd { margin: 0; word-break: break-word; }
.gp .toolbar { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin-bottom: 10px; }
.gp .toolbar input[type=search] { min-width: 260px; }
.gp .pager { display: flex; gap: 8px; align-items: center; margin-top: 8px; }
.gp .runlist { display: flex; flex-wrap: wrap; gap: 6px 16px; margin-bottom: 12px; }
.gp .runlist label { display: flex; gap: 4px; align-items: center; }
.gp .legend-dot { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: middle; }
.gp .topo td, .gp .topo th { text-align: center; }
.gp a { color: var(--link); }
.gp tr.straggler td { color: var(--high); font-weight: 500; }
.gp .pp-row { display: grid; grid-template-columns: 160px minmax(0, 1fr) 90px; gap: 8px; align-items: center; margin-bottom: 6px; }
.gp .pp-bar { display: flex; height: 22px; border-radius: 3px; overflow: hidden; background: transparent; border: 1px solid var(--border); }
.gp .pp-seg { display: block; height: 100%; border: 0; padding: 0; margin: 0; border-radius: 0; min-width: 0; cursor: pointer; }
.gp .pp-seg[aria-pressed=true] { outline: 2px solid var(--fg); outline-offset: -2px; }
.gp .pp-gap { display: block; width: 6px; flex: none; }
.gp .pp-outside { background-image: repeating-linear-gradient(45deg, rgba(255,255,255,.45) 0 3px, transparent 3px 7px); cursor: default; }
.gp .linklike { background: none; border: 0; padding: 0; color: inherit; cursor: pointer; font: inherit; text-align: left; }
.gp tr.selected td { background: var(--code); }
`;
