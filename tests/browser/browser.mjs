// The driver: serves page.html and app.js on 127.0.0.1 (the allowed origin) and the same files under
// "localhost" (another origin, not allowed), then loads the page in headless Chromium (Debian's, through
// playwright-core) and reads what it rendered. Files (in the current directory): writes page.port once the
// page server listens; reads gw.port (the gateway's port) when it appears. Prints ok:/FAIL: lines; exit 0
// when all passed, 1 when one failed, 77 when Chromium cannot start.
import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFileSync, writeFileSync, existsSync, renameSync } from "node:fs";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const TOKEN = process.env.TOKEN;
let passed = 0, failed = 0;
const ok = (what) => { passed++; console.log(`ok: ${what}`); };
const fail = (what, why) => { failed++; console.log(`FAIL: ${what}: ${why}`); };
const check = (what, cond, why = "") => (cond ? ok(what) : fail(what, why));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const files = { "/page.html": ["text/html", readFileSync("page.html")], "/app.js": ["text/javascript", readFileSync("app.js")] };
const server = createServer((req, res) => {
  const f = files[new URL(req.url, "http://x").pathname];
  if (!f) { res.writeHead(req.url === "/favicon.ico" ? 204 : 404).end(); return; }
  res.writeHead(200, { "Content-Type": f[0], "Cache-Control": "no-store" }).end(f[1]);
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const PAGE_PORT = server.address().port;
writeFileSync("page.port.tmp", `${PAGE_PORT}\n`);
renameSync("page.port.tmp", "page.port");

let gwPort = null;
for (let i = 0; i < 200 && gwPort === null; i++) {
  if (existsSync("gw.port")) gwPort = readFileSync("gw.port", "utf8").split("\n")[0].trim() || null;
  if (gwPort === null) await sleep(100);
}
if (gwPort === null) { console.log("FAIL: the gateway did not start"); process.exit(1); }
const GW = `http://127.0.0.1:${gwPort}/v1/ag-ui`;

let browser;
try {
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, timeout: 30000,
                                    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
} catch (e) {
  console.log(`SKIP: Chromium cannot start here (${CHROMIUM}): ${String(e.message).split("\n")[0]}`);
  server.close();
  process.exit(77);
}
async function load(origin) {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.log(`  (page console: ${m.text().split("\n")[0].slice(0, 240)})`); });
  await page.goto(`${origin}/page.html?gw=${encodeURIComponent(GW)}&token=${encodeURIComponent(TOKEN)}`, { timeout: 10000 });
  await page.waitForSelector("body[data-done]", { timeout: 40000 });
  const done = await page.getAttribute("body", "data-done");
  const conversations = await page.$$eval("section.conversation", (ss) => ss.map((s) => ({
    name: s.dataset.name, status: s.dataset.status, error: s.querySelector(".error")?.textContent ?? null,
    messages: [...s.querySelectorAll(".message")].map((d) => ({
      role: d.dataset.role, content: d.querySelector(".content")?.textContent ?? null, toolCallId: d.dataset.toolCallId ?? null,
      calls: [...d.querySelectorAll(".tool-call")].map((c) => ({ name: c.dataset.name, id: c.dataset.id, args: c.textContent })),
    })),
  })));
  await page.close();
  return { done, conversations };
}

try {
  // 1. The allowed origin: the three scenarios, rendered; a message too large, refused readably.
  const { done, conversations } = await load(`http://127.0.0.1:${PAGE_PORT}`);
  const byName = Object.fromEntries(conversations.map((c) => [c.name, c]));
  check("allowed origin: every conversation ended without error", done === "ok", done);
  const text = byName.text?.messages ?? [];
  check("text: the page rendered the user's message and the answer",
        text.length === 2 && text[0].content === "Hello" && text[1].role === "assistant" &&
        text[1].content === "Hello! How can I help you?", JSON.stringify(text));
  const st = byName["server-tool"]?.messages ?? [];
  const weather = st.flatMap((m) => m.calls).find((c) => c.name === "get_weather");
  let wargs = null;
  try { wargs = JSON.parse(weather?.args ?? ""); } catch { /* checked below */ }
  check("server tool: the page rendered the get_weather call with its arguments", wargs?.city === "Paris", JSON.stringify(st));
  check("server tool: and the tool's result", st.some((m) => m.role === "tool" && m.toolCallId === weather?.id && /Sunny/.test(m.content ?? "")),
        JSON.stringify(st));
  check("server tool: and the final text", /sunny/i.test(st.at(-1)?.content ?? ""), JSON.stringify(st.at(-1)));
  const ft = byName["frontend-tool"]?.messages ?? [];
  const search = ft.flatMap((m) => m.calls).find((c) => c.name === "search_local_files");
  let sargs = null;
  try { sargs = JSON.parse(search?.args ?? ""); } catch { /* checked below */ }
  check("frontend tool: the page rendered the call to its own tool, with its arguments",
        !!search && typeof sargs?.keyword === "string", JSON.stringify(ft));
  const big = byName["too-large"];
  check("too large: the run failed, and the page read the gateway's 413 and its message",
        big?.status === "error" && /^HTTP 413: .*payload too large: the limit is 65536 bytes/.test(big?.error ?? ""),
        JSON.stringify(big?.error));

  // 2. Another origin: the preflight is refused, every run fails in the page, nothing is rendered.
  const other = await load(`http://localhost:${PAGE_PORT}`);
  check("another origin: the page's runs fail", other.done.startsWith("error"), other.done);
  check("another origin: every conversation failed",
        other.conversations.length === 4 && other.conversations.every((c) => c.status === "error"),
        JSON.stringify(other.conversations));
  check("another origin: no answer was rendered",
        other.conversations.every((c) => c.messages.every((m) => m.role === "user")), JSON.stringify(other.conversations));
} catch (e) {
  fail("the browser test", e.stack ?? e);
} finally {
  await browser.close();
  server.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
