// Each case of upstream_events.json through the gateway into the official client: a backend's event
// that the client's schemas would refuse (which fails the client's whole run with a validation error)
// must reach it as the gateway's RUN_ERROR INVALID_EVENT naming the member, and an event the client
// accepts (or drops) must pass, the run then resolving. A case marked "direct" is also played to the
// client straight from the backend: the client must end with the same messages both ways (the
// gateway expands chunk streams as the client would); a case with "direct_fails" is played straight
// from the backend too, and the client must fail the run with that text. Env: GW (…/v1/ag-ui),
// TOKEN, CASES (the file), AGENT (the scripted backend's base URL).
import { readFileSync } from "node:fs";
import { HttpAgent } from "@ag-ui/client";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "1";
console.warn = () => {};
const cases = JSON.parse(readFileSync(process.env.CASES, "utf8"));
let failed = 0;

// Runs case <c> from <url>: what the run came to ("ok", the RUN_ERROR, or how the client failed)
// and the messages the client holds after it.
async function play(c, url, headers) {
  const agent = new HttpAgent({ url, headers });
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
  return { got, messages: JSON.stringify(agent.messages) };
}

for (const c of cases) {
  const via = await play(c, `${process.env.GW}/agents/${c.name}/runs`,
                         { Authorization: `Bearer ${process.env.TOKEN}` });
  if (via.got !== c.expect) {
    failed++;
    console.log(`FAIL: ${c.name}: expected «${c.expect}», got «${via.got}»`);
    continue;
  }
  if (c.direct_fails) { // what the gateway refused, the client fails on straight from the backend
    const direct = await play(c, `${process.env.AGENT}/case/${c.name}`, {});
    if (!direct.got.startsWith("the client failed:") || !direct.got.includes(c.direct_fails)) {
      failed++;
      console.log(`FAIL: ${c.name}: straight from the backend «${direct.got}», expected the client to ` +
                  `fail with «${c.direct_fails}»`);
      continue;
    }
  }
  if (c.direct) {
    const direct = await play(c, `${process.env.AGENT}/case/${c.name}`, {});
    if (direct.got !== "ok" || direct.messages !== via.messages) {
      failed++;
      console.log(`FAIL: ${c.name}: straight from the backend «${direct.got}» with ${direct.messages}, ` +
                  `through the gateway ${via.messages}`);
      continue;
    }
  }
  console.log(`ok: ${c.name}: ${via.got}${c.direct ? " (the same messages straight from the backend)" : ""}` +
              `${c.direct_fails ? " (the client fails on it straight from the backend)" : ""}`);
}
console.log(`${cases.length - failed} of ${cases.length} cases as expected`);
process.exit(failed === 0 ? 0 : 1);
