// Builds the dashboard into ONE minified ES module (tb_gpuprof/static/index.js) exporting render().
// Byte-reproducible: pinned esbuild, no timestamps/banners/sourcemaps, no absolute paths in output,
// so CI can rebuild and compare with the committed bundle (see check_bundle.sh).
import { build } from "esbuild";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const outIdx = args.indexOf("--outfile");
const outfile = outIdx >= 0 ? resolve(args[outIdx + 1]) : resolve(here, "../tb_gpuprof/static/index.js");

// The report's types first: src/report.gen.ts from report.schema.json (`tb-gpuprof schema`).
const gen = await import("./gen_types.mjs");
writeFileSync(resolve(here, "src/report.gen.ts"),
              gen.generate(JSON.parse(readFileSync(resolve(here, "report.schema.json"), "utf8"))));

const result = await build({
  absWorkingDir: here,
  entryPoints: ["src/main.tsx"],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: ["es2020", "chrome100", "firefox100", "safari15"],
  minify: true,
  treeShaking: true,
  sourcemap: false,
  legalComments: "eof",
  charset: "ascii",
  jsx: "automatic",
  jsxImportSource: "preact",
  define: { "process.env.NODE_ENV": '"production"', __DEV__: "false" },
  write: false,
  logLevel: "warning",
});
mkdirSync(dirname(outfile), { recursive: true });
writeFileSync(outfile, result.outputFiles[0].contents);
console.log(`wrote ${outfile} (${result.outputFiles[0].contents.length} bytes)`);
