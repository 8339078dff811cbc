// Interop tests: the official @ag-ui/client (pinned in package.json) against the real gateway in front of the
// real demo agent. Every scenario must pass the client's own verifier (runAgent resolves) and rebuild the
// expected messages; hostile upstreams must reach the client as one valid stream, and a run cut mid-message
// must reach it as RUN_ERROR, never as a clean success. Environment: GW (gateway base URL), DEMO (demo agent
// base URL), TOKEN (bearer token), CA (CA file for the TLS listener, with GWTLS its https base URL).
import { HttpAgent } from "@ag-ui/client";

const GW = process.env.GW, DEMO = process.env.DEMO, TOKEN = process.env.TOKEN;
let passed = 0, failed = 0;
const ok = (what) => { passed++; console.log(`ok: ${what}`); };
const fail = (what, why) => { failed++; console.log(`FAIL: ${what}: ${why}`); };
const check = (what, cond, why = "") => (cond ? ok(what) : fail(what, why));

// Runs one agent turn with a 10 s bound. Returns {events, messages, error, result}.
async function run(url, { threadId = "thread-" + Math.random().toString(16).slice(2), messages, tools = [], headers } = {}) {
  const agent = new HttpAgent({
    url,
    threadId,
    headers: headers ?? { Authorization: `Bearer ${TOKEN}` },
    initialMessages: messages,
  });
  const events = [];
  const abortController = new AbortController();
  const timer = setTimeout(() => abortController.abort(), 10000);
  let error = null, result = null;
  try {
    result = await agent.runAgent({ tools, abortController }, {
      onEvent: ({ event }) => { events.push(event); },
    });
  } catch (e) {
    error = e;
  } finally {
    clearTimeout(timer);
  }
  return { agent, events, messages: agent.messages, error, result, threadId };
}

// Thread history: what GET …/threads/{id}/messages returns must be what the client holds after its runs (the
// same ids, roles, contents, metadata, tool calls and tool call ids, in the same order).
const shape = (m) => JSON.stringify({
  id: m.id, role: m.role, content: m.content ?? null, toolCallId: m.toolCallId ?? null, metadata: m.metadata ?? null,
  toolCalls: (m.toolCalls ?? []).map((c) => ({ id: c.id, type: c.type, name: c.function?.name, arguments: c.function?.arguments })),
});
async function historyMatches(what, threadId, messages) {
  const res = await fetch(`${GW}/threads/${encodeURIComponent(threadId)}/messages?limit=200`,
                          { headers: { Authorization: `Bearer ${TOKEN}` } });
  const body = await res.json();
  const got = (body.messages ?? []).map(shape), want = messages.map(shape);
  check(`${what}: the thread's history equals the client's messages`,
        res.status === 200 && JSON.stringify(got) === JSON.stringify(want) && body.has_more === false,
        `HTTP ${res.status}\n  history: ${got.join("\n           ")}\n  client:  ${want.join("\n           ")}`);
}

const types = (events) => events.map((e) => e.type);
const user = (id, content) => ({ id, role: "user", content });
const idsMatch = (r) =>
  r.events.every((e) => (e.threadId === undefined || e.threadId === r.threadId));

// 1. Pure conversation (scenario 1).
{
  const r = await run(`${GW}/agents/demo/runs`, { messages: [user("m1", "Hello")] });
  check("conversation: the verifier accepts the stream", !r.error, r.error);
  const last = r.messages[r.messages.length - 1];
  check("conversation: an assistant message is rebuilt", last?.role === "assistant" && last.content === "Hello! How can I help you?",
        JSON.stringify(last));
  check("conversation: events carry the client's threadId", idsMatch(r));
  check("conversation: RUN_STARTED first, RUN_FINISHED last",
        types(r.events)[0] === "RUN_STARTED" && types(r.events).at(-1) === "RUN_FINISHED", types(r.events).join(","));
  await historyMatches("conversation", r.threadId, r.messages);
}

// 1b. A model that reasons before it answers: the client makes a "reasoning" message of the reasoning
// events, and the thread's history holds it too, in its place, over two runs (the second resends it).
{
  const r = await run(`${GW}/agents/reasoning/runs`, { messages: [user("m1", "Hi there")] });
  check("reasoning: the verifier accepts the stream", !r.error, r.error);
  const thought = r.messages.find((m) => m.role === "reasoning");
  check("reasoning: the client holds a reasoning message before the answer",
        thought?.content === 'The user said "Hi there": answer kindly.' &&
        r.messages.indexOf(thought) === r.messages.length - 2, JSON.stringify(r.messages));
  await historyMatches("reasoning", r.threadId, r.messages);
  const r2 = await run(`${GW}/agents/reasoning/runs`,
                       { threadId: r.threadId, messages: [...r.messages, user("m2", "And again")] });
  check("reasoning: the second run is accepted", !r2.error, r2.error);
  check("reasoning: two reasoning messages after two runs",
        r2.messages.filter((m) => m.role === "reasoning").length === 2, JSON.stringify(r2.messages));
  await historyMatches("reasoning (two runs)", r.threadId, r2.messages);
}

// 1c. Activity messages: a plan shown by ACTIVITY_SNAPSHOT and changed by ACTIVITY_DELTA's JSON Patch. The
// client holds it (and never sends it back); the thread's history holds the same, after each of two runs.
{
  const r = await run(`${GW}/agents/activity/runs`, { messages: [user("m1", "Plan it")] });
  check("activity: the verifier accepts the stream", !r.error, r.error);
  const plan = r.messages.find((m) => m.role === "activity");
  const answer = r.messages.at(-1);
  check("activity: the client merged the answer's metadata",
        answer?.metadata?.model === "agui-demo" && answer?.metadata?.finishReason === "stop", JSON.stringify(answer));
  check("activity: the client holds the patched plan",
        JSON.stringify(plan?.content) === JSON.stringify({ steps: ["read", "answer", "done"], done: 2 }),
        JSON.stringify(r.messages));
  await historyMatches("activity", r.threadId, r.messages);
  const r2 = await run(`${GW}/agents/activity/runs`,
                       { threadId: r.threadId, messages: [...r.messages, user("m2", "Again")] });
  check("activity: the second run is accepted", !r2.error, r2.error);
  await historyMatches("activity (two runs)", r.threadId, r2.messages);
}

// 1d. An orchestrator that streams its answer as chunks while a sub-agent streams its own: the chunks
// without an id go to their lane's message (the parent's, or the sub-agent's), as the client's chunk
// transformation keeps one stream per lane; the thread's history holds the same messages.
{
  const r = await run(`${GW}/agents/subagent/runs`, { messages: [user("m1", "Look it up")] });
  check("sub-agent: the verifier accepts the stream", !r.error, r.error);
  const answer = r.messages.find((m) => m.role === "assistant" && m.subagentRunId === undefined);
  const helper = r.messages.find((m) => m.subagentRunId !== undefined);
  check("sub-agent: the client holds the whole answer and the sub-agent's message apart",
        answer?.content === 'Hello! You said: "Look it up". How can I help you?' &&
        helper?.content === "Looking it up.", JSON.stringify(r.messages));
  await historyMatches("sub-agent", r.threadId, r.messages);
  const r2 = await run(`${GW}/agents/subagent/runs`,
                       { threadId: r.threadId, messages: [...r.messages, user("m2", "Again")] });
  check("sub-agent: the second run is accepted", !r2.error, r2.error);
  await historyMatches("sub-agent (two runs)", r.threadId, r2.messages);
}

// 2. Server-side tool get_weather (scenario 2).
{
  const r = await run(`${GW}/agents/demo/runs`, { messages: [user("m1", "What is the weather in Paris?")] });
  check("server tool: the verifier accepts the stream", !r.error, r.error);
  const call = r.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "get_weather");
  check("server tool: assistant toolCalls with get_weather", !!call, JSON.stringify(r.messages));
  let args = null;
  try { args = JSON.parse(call?.function.arguments ?? ""); } catch { /* checked below */ }
  check("server tool: arguments assembled into JSON", args && typeof args.city === "string", call?.function.arguments);
  check("server tool: a tool message with the result", r.messages.some((m) => m.role === "tool" && m.toolCallId === call?.id));
  check("server tool: a final assistant text", r.messages.at(-1)?.role === "assistant" && /sunny/i.test(r.messages.at(-1)?.content ?? ""),
        JSON.stringify(r.messages.at(-1)));
  await historyMatches("server tool", r.threadId, r.messages);
}

// 3. Frontend tool (scenario 3), then the follow-up run with its result.
{
  const tools = [{ name: "search_local_files", description: "Search files on this computer",
                   parameters: { type: "object", properties: { keyword: { type: "string" } }, required: ["keyword"] } }];
  const r = await run(`${GW}/agents/demo/runs`, { messages: [user("m1", "Search my local files for report")], tools });
  check("frontend tool: the verifier accepts the stream", !r.error, r.error);
  const call = r.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "search_local_files");
  check("frontend tool: the run ends with a call to the client's tool", !!call && types(r.events).at(-1) === "RUN_FINISHED",
        types(r.events).join(","));
  const follow = [...r.messages, { id: "tool-result-1", role: "tool", toolCallId: call?.id, content: JSON.stringify(["a.pdf", "b.pdf"]) }];
  const r2 = await run(`${GW}/agents/demo/runs`, { threadId: r.threadId, messages: follow, tools });
  check("frontend tool: the follow-up run passes", !r2.error, r2.error);
  check("frontend tool: the final text uses the result", /2 files/.test(r2.messages.at(-1)?.content ?? ""), JSON.stringify(r2.messages.at(-1)));
  await historyMatches("frontend tool (two runs)", r.threadId, r2.messages);
}

// 4. Human in the loop: confirmAction (scenario 4), approved and denied.
for (const [decision, expect] of [["true", /Successfully deleted/], ['{"approved":false}', /Cancelled/]]) {
  const tools = [{ name: "confirmAction", description: "Ask the user to confirm",
                   parameters: { type: "object", properties: { action: { type: "string" } } } }];
  const r = await run(`${GW}/agents/demo/runs`, { messages: [user("m1", "Please delete the temporary files")], tools });
  check(`confirm (${decision}): the first run passes`, !r.error, r.error);
  const call = r.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "confirmAction");
  check(`confirm (${decision}): the run asks for confirmation`, !!call, JSON.stringify(r.messages));
  const follow = [...r.messages, { id: "decision-1", role: "tool", toolCallId: call?.id, content: decision }];
  const r2 = await run(`${GW}/agents/demo/runs`, { threadId: r.threadId, messages: follow, tools });
  check(`confirm (${decision}): the decision run passes`, !r2.error, r2.error);
  check(`confirm (${decision}): the answer reflects the decision`, expect.test(r2.messages.at(-1)?.content ?? ""),
        JSON.stringify(r2.messages.at(-1)));
  await historyMatches(`confirm (${decision}, two runs)`, r.threadId, r2.messages);
}

// 4b. Human in the loop with a live run: the run waits after its confirmAction call, the decision arrives on a
// second, decision-only request (202 decision_forwarded), and the client's original run ends with its effect.
for (const [decision, expect] of [["true", /^Successfully deleted 15 temporary files\.$/], ["false", /^Cancelled/]]) {
  const tools = [{ name: "confirmAction", description: "Ask the user to confirm",
                   parameters: { type: "object", properties: { action: { type: "string" } } } }];
  const threadId = "thread-live-" + Math.random().toString(16).slice(2);
  const agent = new HttpAgent({ url: `${GW}/agents/hitl/runs`, threadId, headers: { Authorization: `Bearer ${TOKEN}` },
                                initialMessages: [user("m1", "Please delete the temporary files")] });
  const events = [];
  let runId = null, forwarded = null, error = null;
  const decide = async (toolCallId) => {
    const res = await fetch(`${GW}/agents/hitl/runs`, {
      method: "POST",
      headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
      body: JSON.stringify({ threadId, runId, messages: [{ id: "decision-1", role: "tool", toolCallId, content: decision }],
                             tools, context: [], state: {}, forwardedProps: {} }),
    });
    return { status: res.status, body: await res.json() };
  };
  const abortController = new AbortController();
  const timer = setTimeout(() => abortController.abort(), 10000);
  try {
    await agent.runAgent({ tools, abortController }, {
      onEvent: ({ event }) => {
        events.push(event);
        if (event.type === "RUN_STARTED") runId = event.runId;
        if (event.type === "TOOL_CALL_END" && !forwarded) forwarded = decide(event.toolCallId);
      },
    });
  } catch (e) {
    error = e;
  } finally {
    clearTimeout(timer);
  }
  const fwd = forwarded ? await forwarded : null;
  check(`live decision (${decision}): the verifier accepts the one run`, !error, error);
  check(`live decision (${decision}): the decision request gets 202 decision_forwarded for the live run`,
        fwd?.status === 202 && fwd.body.status === "decision_forwarded" && fwd.body.threadId === threadId && fwd.body.runId === runId,
        JSON.stringify(fwd));
  check(`live decision (${decision}): one run, RUN_STARTED first and RUN_FINISHED last`,
        types(events).filter((t) => t === "RUN_STARTED").length === 1 && types(events).at(-1) === "RUN_FINISHED",
        types(events).join(","));
  check(`live decision (${decision}): the tool call and the answer are in the client's messages`,
        agent.messages.some((m) => m.toolCalls?.some((c) => c.function.name === "confirmAction")) &&
        expect.test(agent.messages.at(-1)?.content ?? ""), JSON.stringify(agent.messages));
}

// 4c. The backend's answer decides what a decision-only request gets. The first run waits after its
// confirmAction call; the decision is sent by a second HttpAgent whose history is the tool call and its result
// only (so it is decision-only), with the first run's ids. A backend that starts a new run for the decision
// ("stream", as Mastra and AG-Kit do): the client gets that run, and its verifier accepts it. A backend that
// answers an empty stream ("empty", as CopilotKit does) or refuses: the client gets an HTTP error, never 202.
for (const [mode, want] of [["stream", "run"], ["empty", 502], ["refuse", 502]]) {
  const tools = [{ name: "confirmAction", description: "Ask the user to confirm",
                   parameters: { type: "object", properties: { action: { type: "string" } } } }];
  const threadId = `thread-${mode}-` + Math.random().toString(16).slice(2);
  const url = `${GW}/agents/hitl${mode}/runs`;
  const first = new HttpAgent({ url, threadId, headers: { Authorization: `Bearer ${TOKEN}` },
                                initialMessages: [user("m1", "Please delete the temporary files")] });
  const events = [], devents = [];
  let runId = null, decided = null, error = null;
  const decide = async (call) => {
    const second = new HttpAgent({ url, threadId, headers: { Authorization: `Bearer ${TOKEN}` },
      initialMessages: [{ id: "a1", role: "assistant", content: "", toolCalls: [call] },
                        { id: "decision-1", role: "tool", toolCallId: call.id, content: "true" }] });
    try {
      await second.runAgent({ runId, tools }, { onEvent: ({ event }) => { devents.push(event); } });
      return { agent: second, error: null };
    } catch (e) {
      return { agent: second, error: e };
    }
  };
  const abortController = new AbortController();
  const timer = setTimeout(() => abortController.abort(), mode === "stream" ? 10000 : 3000);
  try {
    await first.runAgent({ tools, abortController }, {
      onEvent: ({ event, messages }) => {
        events.push(event);
        if (event.type === "RUN_STARTED") runId = event.runId;
        if (event.type === "TOOL_CALL_END" && !decided) {
          const call = first.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === event.toolCallId) ??
                       { id: event.toolCallId, type: "function", function: { name: "confirmAction", arguments: "{}" } };
          decided = decide(call);
        }
      },
    });
  } catch (e) {
    error = e;
  } finally {
    clearTimeout(timer);
  }
  const d = decided ? await decided : null;
  if (want === "run") {
    check(`decision answered with a new stream: the client's verifier accepts that run`, d && !d.error, d?.error);
    check(`decision answered with a new stream: it carries the decision's ids, RUN_STARTED first, RUN_FINISHED last`,
          devents[0]?.type === "RUN_STARTED" && devents[0]?.threadId === threadId && devents[0]?.runId === runId &&
          devents.at(-1)?.type === "RUN_FINISHED", types(devents).join(","));
    check(`decision answered with a new stream: the answer is in the client's messages`,
          /^Successfully deleted 15 temporary files\.$/.test(d?.agent.messages.at(-1)?.content ?? ""),
          JSON.stringify(d?.agent.messages));
    check(`decision answered with a new stream: the first run ends cleanly too`,
          !error && types(events).at(-1) === "RUN_FINISHED", `${types(events).join(",")} ${error}`);
  } else {
    check(`decision answered "${mode}": the client gets HTTP ${want}, not 202`,
          d?.error && new RegExp(`HTTP ${want}`).test(String(d.error?.message ?? d.error)) && devents.length === 0,
          `${d?.error} ${types(devents).join(",")}`);
  }
}

// 5. Hostile upstreams through the gateway: one valid stream each.
for (const agent of ["bytewise", "crlf", "bare", "multiline"]) {
  const r = await run(`${GW}/agents/${agent}/runs`, { messages: [user("m1", "Hello")] });
  check(`${agent} upstream: the verifier accepts the stream`, !r.error, r.error);
  check(`${agent} upstream: the assistant text is complete`, r.messages.at(-1)?.content === "Hello! How can I help you?",
        JSON.stringify(r.messages.at(-1)));
  check(`${agent} upstream: one RUN_STARTED, RUN_FINISHED last`,
        types(r.events).filter((t) => t === "RUN_STARTED").length === 1 && types(r.events).at(-1) === "RUN_FINISHED",
        types(r.events).join(","));
}
{
  const r = await run(`${GW}/agents/cloudbase/runs`, { messages: [user("m1", "Hello")] });
  const err = r.events.find((e) => e.type === "RUN_ERROR");
  check("CloudBase dialect: RUN_ERROR reaches the client with message and code",
        err && typeof err.message === "string" && typeof err.code === "string", JSON.stringify(err ?? r.error?.message));
}
{
  const r = await run(`${GW}/agents/drop/runs`, { messages: [user("m1", "Hello")] });
  const err = r.events.find((e) => e.type === "RUN_ERROR");
  check("upstream lost mid-message: the client sees RUN_ERROR UPSTREAM_ERROR, not success",
        err?.code === "UPSTREAM_ERROR" && !r.events.some((e) => e.type === "RUN_FINISHED"),
        `${types(r.events).join(",")} ${r.error?.message ?? ""}`);
}

// 6. Controls: the same hostile upstreams straight to the client fail, so the gateway is what fixes them.
{
  const r = await run(`${DEMO}/agent?crlf=1`, { messages: [user("m1", "Hello")], headers: {} });
  check("control: a CRLF upstream without the gateway breaks the client", !!r.error || r.messages.at(-1)?.role !== "assistant",
        "the client accepted it");
}
{
  const r = await run(`${DEMO}/agent?lifecycle=none&done=1`, { messages: [user("m1", "Hello")], headers: {} });
  check("control: [DONE] without the gateway breaks the client", !!r.error, "the client accepted it");
}
// 7. Errors before the stream reach the client as HTTP status + JSON.
{
  const r = await run(`${GW}/agents/demo/runs`, { messages: [user("m1", "Hello")], headers: { Authorization: "Bearer wrong" } });
  check("a wrong token: the client fails with HTTP 401", r.error && /401/.test(String(r.error?.message ?? r.error)), String(r.error));
}

// 8. A full run over TLS.
if (process.env.GWTLS) {
  const r = await run(`${process.env.GWTLS}/agents/demo/runs`, { messages: [user("m1", "Hello")] });
  check("a run over TLS passes the verifier", !r.error && r.messages.at(-1)?.content === "Hello! How can I help you?",
        r.error ?? JSON.stringify(r.messages.at(-1)));
}

// 9. A legacy AG-Kit backend ("protocol": "ag-kit"): the seed scenarios reach the client as AG-UI it verifies and
// rebuilds into the same messages as from an AG-UI backend.
{
  const r = await run(`${GW}/agents/legacy/runs`, { messages: [user("m1", "Hello")] });
  check("ag-kit chat: the verifier accepts the stream", !r.error, r.error);
  check("ag-kit chat: an assistant message is rebuilt", r.messages.at(-1)?.role === "assistant" &&
        r.messages.at(-1)?.content === "Hello! How can I help you?", JSON.stringify(r.messages.at(-1)));
  await historyMatches("ag-kit chat", r.threadId, r.messages);
}
{
  const r = await run(`${GW}/agents/legacy/runs`, { messages: [user("m1", "What is the weather in Paris?")] });
  check("ag-kit server tool: the verifier accepts the stream", !r.error, r.error);
  const call = r.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "get_weather");
  check("ag-kit server tool: assistant toolCalls with get_weather and its arguments",
        !!call && JSON.parse(call.function.arguments).city === "Paris", JSON.stringify(r.messages));
  check("ag-kit server tool: the tool-result became a tool message",
        r.messages.some((m) => m.role === "tool" && m.toolCallId === call?.id && /Sunny/.test(m.content)), JSON.stringify(r.messages));
  check("ag-kit server tool: a final assistant text", /sunny/i.test(r.messages.at(-1)?.content ?? ""), JSON.stringify(r.messages.at(-1)));
  await historyMatches("ag-kit server tool", r.threadId, r.messages);
}
{
  const tools = [{ name: "search_local_files", description: "Search files on this computer",
                   parameters: { type: "object", properties: { keyword: { type: "string" } }, required: ["keyword"] } }];
  const r = await run(`${GW}/agents/legacy/runs`, { messages: [user("m1", "Search my local files for report")], tools });
  check("ag-kit client tool: the verifier accepts the stream", !r.error, r.error);
  const call = r.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "search_local_files");
  check("ag-kit client tool: the run ends with a call to the client's tool", !!call && types(r.events).at(-1) === "RUN_FINISHED",
        types(r.events).join(","));
  const follow = [...r.messages, { id: "tool-result-1", role: "tool", toolCallId: call?.id, content: JSON.stringify(["a.pdf", "b.pdf"]) }];
  const r2 = await run(`${GW}/agents/legacy/runs`, { threadId: r.threadId, messages: follow, tools });
  check("ag-kit client tool: the follow-up run passes and answers", !r2.error && r2.messages.at(-1)?.role === "assistant",
        r2.error ?? JSON.stringify(r2.messages.at(-1)));
  const sent = await (await fetch(`${DEMO}/_demo/last-request`)).json();
  check("ag-kit client tool: the backend got only the tool message",
        JSON.stringify(JSON.parse(sent.body).messages) ===
        JSON.stringify([{ role: "tool", content: JSON.stringify(["a.pdf", "b.pdf"]), toolCallId: call?.id }]), sent.body);
}
{
  const tools = [{ name: "confirmAction", description: "confirm", parameters: { type: "object" } }];
  const r = await run(`${GW}/agents/legacy/runs`, { messages: [user("m1", "Please delete the temporary files")], tools });
  const fin = r.events.find((e) => e.type === "RUN_FINISHED");
  check("ag-kit interrupt: the verifier accepts the run that ends with it", !r.error, r.error);
  check("ag-kit interrupt: RUN_FINISHED carries it as its outcome",
        fin?.outcome?.type === "interrupt" && fin.outcome.interrupts?.[0]?.id === "call_003", JSON.stringify(fin));
  // resume: the same client answers the interrupt on its next run; the legacy backend gets resume {interruptId,
  // payload} and goes on.
  let error = null;
  const before = r.agent.messages.length;
  try {
    await r.agent.runAgent({ tools, resume: [{ interruptId: "call_003", status: "resolved", payload: { approved: true } }] });
  } catch (e) {
    error = e;
  }
  check("ag-kit resume: the verifier accepts the run", !error, error);
  check("ag-kit resume: the answer is rebuilt", r.agent.messages.length > before &&
        /approved and carried out/.test(r.agent.messages.at(-1)?.content ?? ""), JSON.stringify(r.agent.messages.at(-1)));
  const sent = await (await fetch(`${DEMO}/_demo/last-request`)).json();
  check("ag-kit resume: the backend got resume {interruptId, payload}",
        JSON.stringify(JSON.parse(sent.body).resume) === JSON.stringify({ interruptId: "call_003", payload: { approved: true } }),
        sent.body);
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
