// Entry point TensorBoard loads (frontend_metadata.es_module_path): plugin_entry.html imports this
// module and calls render() inside the plugin's iframe.
import { render as preactRender } from "preact";
import { App, prefetchLastRun } from "./app";
import { CSS } from "./style";

export function render(): void {
  prefetchLastRun();
  if (!document.getElementById("gpuprof-style")) {
    const style = document.createElement("style");
    style.id = "gpuprof-style";
    style.textContent = CSS;
    document.head.appendChild(style);
  }
  let root = document.getElementById("gpuprof-root");
  if (!root) {
    root = document.createElement("div");
    root.id = "gpuprof-root";
    document.body.appendChild(root);
  }
  preactRender(<App />, root);
}
