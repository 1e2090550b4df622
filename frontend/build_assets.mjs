#!/usr/bin/env node
// Copy the browser dependencies pinned in package-lock.json from node_modules/
// into frontend/static/vendor/, where Django's staticfiles finds them.
//
// Plain Node, no dependencies: run `npm ci --ignore-scripts` first (the
// Makefile does). Nothing is fetched from a CDN at runtime, because GPU
// clusters are often air-gapped.
//
// Source-map comments are stripped from the copied .js and .css files: the
// .map files are not vendored, and whitenoise's manifest storage fails
// collectstatic on a reference to a file that does not exist.
//
// Idempotent: a file is rewritten only when its content changes, and files in
// the vendor directory that are not listed below are removed.

import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync, renameSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const NODE_MODULES = join(ROOT, "node_modules");
const VENDOR = join(ROOT, "frontend", "static", "vendor");

// destination (relative to VENDOR) -> [npm package, file inside the package]
const FILES = {
  "htmx/htmx.min.js": ["htmx.org", "dist/htmx.min.js"],
  "pico/pico.min.css": ["@picocss/pico", "css/pico.min.css"],
  "swagger-ui/swagger-ui-bundle.js": ["swagger-ui-dist", "swagger-ui-bundle.js"],
  "swagger-ui/swagger-ui-standalone-preset.js": ["swagger-ui-dist", "swagger-ui-standalone-preset.js"],
  "swagger-ui/swagger-ui.css": ["swagger-ui-dist", "swagger-ui.css"],
  "swagger-ui/favicon-32x32.png": ["swagger-ui-dist", "favicon-32x32.png"],
  "swagger-ui/favicon-16x16.png": ["swagger-ui-dist", "favicon-16x16.png"],
  "uplot/uPlot.iife.min.js": ["uplot", "dist/uPlot.iife.min.js"],
  "uplot/uPlot.min.css": ["uplot", "dist/uPlot.min.css"],
};

// `//# sourceMappingURL=...` (JS) and `/*# sourceMappingURL=... */` (CSS), alone on a line.
const SOURCE_MAP_LINE = /^[ \t]*(?:\/\/[#@] sourceMappingURL=[^\r\n]*|\/\*[#@] sourceMappingURL=[^\r\n]*?\*\/)[ \t]*\r?\n?/gm;

function fail(message) {
  console.error(`build_assets: ${message}`);
  process.exit(1);
}

function pinnedVersions() {
  const manifest = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  return manifest.dependencies ?? {};
}

function checkInstalled(pkg, wanted) {
  const manifestPath = join(NODE_MODULES, pkg, "package.json");
  if (!existsSync(manifestPath)) {
    fail(`${pkg} is not installed in node_modules/; run \`npm ci --ignore-scripts\` first.`);
  }
  const installed = JSON.parse(readFileSync(manifestPath, "utf8")).version;
  if (wanted !== undefined && installed !== wanted) {
    fail(`node_modules/${pkg} is ${installed} but package.json pins ${wanted}; run \`npm ci --ignore-scripts\`.`);
  }
}

function vendoredContent(source) {
  const raw = readFileSync(source);
  if (!/\.(js|css)$/.test(source)) {
    return raw;
  }
  return Buffer.from(raw.toString("utf8").replace(SOURCE_MAP_LINE, ""), "utf8");
}

function sha256(buffer) {
  return createHash("sha256").update(buffer).digest("hex");
}

function writeIfChanged(destination, content) {
  if (existsSync(destination) && sha256(readFileSync(destination)) === sha256(content)) {
    return false;
  }
  mkdirSync(dirname(destination), { recursive: true });
  const temporary = `${destination}.tmp-${process.pid}`;
  writeFileSync(temporary, content);
  renameSync(temporary, destination);
  return true;
}

function listFiles(directory) {
  if (!existsSync(directory)) {
    return [];
  }
  return readdirSync(directory).flatMap((name) => {
    const path = join(directory, name);
    return statSync(path).isDirectory() ? listFiles(path) : [path];
  });
}

function removeStrays(expected) {
  let removed = 0;
  for (const path of listFiles(VENDOR)) {
    if (!expected.has(path)) {
      rmSync(path);
      removed += 1;
    }
  }
  return removed;
}

function main() {
  const pinned = pinnedVersions();
  for (const pkg of new Set(Object.values(FILES).map(([name]) => name))) {
    checkInstalled(pkg, pinned[pkg]);
  }
  const expected = new Set();
  let written = 0;
  for (const [target, [pkg, file]] of Object.entries(FILES)) {
    const source = join(NODE_MODULES, pkg, file);
    if (!existsSync(source)) {
      fail(`missing source file node_modules/${pkg}/${file} (did the package layout change?).`);
    }
    const destination = join(VENDOR, target);
    expected.add(destination);
    if (writeIfChanged(destination, vendoredContent(source))) {
      written += 1;
    }
  }
  const removed = removeStrays(expected);
  const where = relative(ROOT, VENDOR);
  console.log(`build_assets: ${expected.size} files in ${where}/ (${written} updated, ${removed} stale removed)`);
}

main();
