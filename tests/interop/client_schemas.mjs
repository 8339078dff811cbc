// The pinned @ag-ui/core's event schemas, walked: every event and every object an event may hold, by
// path ("RUN_FINISHED.outcome{type=interrupt}.interrupts[]": a member after a dot, [] for an array's
// elements, {key=value} for the kind an object is of), with the names of its members. They must be
// FILE's lines (tests/interop/client_schemas.txt), which test_schema holds the gateway's own tables
// (src/schema.c) against: a client bumped to schemas of other members fails here until the file and
// the tables follow. Env: FILE.
import { readFileSync } from "node:fs";
import { EventSchema } from "@ag-ui/core/schemas";

const out = new Set();
const seen = new Set();
const unwrap = (s) => {
  for (;;) {
    const t = s?.def?.type;
    if (["optional", "nullable", "default", "readonly", "catch", "prefault", "nonoptional"].includes(t))
      s = s.def.innerType;
    else if (t === "pipe") s = s.def.in;
    else if (t === "lazy") s = s.def.getter();
    else return s;
  }
};
const literal = (s) => unwrap(s)?.def?.values?.[0];

function walk(s, path) {
  s = unwrap(s);
  const t = s?.def?.type;
  if (t === "object") {
    const keys = Object.keys(s.shape);
    if (keys.length === 0) return; // (an object of any members: the tables do not look in it either)
    out.add(`${path}: ${keys.sort().join(" ")}`);
    if (seen.has(path)) return;
    seen.add(path);
    for (const k of keys) walk(s.shape[k], `${path}.${k}`);
  } else if (t === "array") {
    walk(s.def.element, `${path}[]`);
  } else if (t === "union") {
    const d = s.def.discriminator;
    for (const o of s.def.options)
      walk(o, d === undefined ? path : `${path}{${d}=${literal(unwrap(o).shape[d])}}`);
  }
}

for (const o of EventSchema.options) walk(o, literal(o.shape.type));
const got = [...out].sort();
const want = readFileSync(process.env.FILE, "utf8").split("\n").filter((l) => l !== "");
const missing = want.filter((l) => !got.includes(l)), extra = got.filter((l) => !want.includes(l));
for (const l of missing) console.log(`FAIL: the client's schemas lack: ${l}`);
for (const l of extra) console.log(`FAIL: the client's schemas have: ${l}`);
console.log(`${got.length} objects of the client's event schemas, ${want.length} in the file`);
process.exit(missing.length === 0 && extra.length === 0 && got.length > 100 ? 0 : 1);
