// Each case of upstream_events.json through the gateway into the official client: a backend's event
// that the client's schemas would refuse (which fails the client's whole run with a validation error)
// must reach it as the gateway's RUN_ERROR INVALID_EVENT naming the member, and an event the client
// accepts (or drops) must pass, the run then resolving. Env: GW (…/v1/ag-ui), TOKEN, CASES (the file).
import { readFileSync } from "node:fs";
import { HttpAgent } from "@ag-ui/client";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "1";
console.warn = () => {};
const cases = JSON.parse(readFileSync(process.env.CASES, "utf8"));
let failed = 0;

for (const c of cases) {
  const agent = new HttpAgent({
    url: `${process.env.GW}/agents/${c.name}/runs`,
    headers: { Authorization: `Bearer ${process.env.TOKEN}` },
  });
  agent.messages = [{ id: "u1", role: "user", content: "hi" }];
  let runError = null;
  let got;
  const saved = console.error;
  console.error = () => {}; // the client reports a failed run there too
  try {
    await agent.runAgent({}, { onRunErrorEvent: ({ event }) => { runError = event; } });
    got = runError ? `${runError.code ?? "RUN_ERROR"}: ${runError.message}` : "ok";
  } catch (e) {
    got = runError ? `${runError.code ?? "RUN_ERROR"}: ${runError.message}`
                   : `the client failed: ${String(e?.message ?? e).replace(/\s+/g, " ").slice(0, 200)}`;
  } finally {
    console.error = saved;
  }
  if (got === c.expect) {
    console.log(`ok: ${c.name}: ${got}`);
  } else {
    failed++;
    console.log(`FAIL: ${c.name}: expected «${c.expect}», got «${got}»`);
  }
}
console.log(`${cases.length - failed} of ${cases.length} cases as expected`);
process.exit(failed === 0 ? 0 : 1);
