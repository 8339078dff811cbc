// The page's code: the official @ag-ui/client HttpAgent, bundled for the browser, runs the demo scenarios
// against the gateway on another origin with a bearer token, and renders each conversation into the DOM
// (what a frontend does). The query string says where: ?gw=<base URL of /v1/ag-ui>&token=<bearer token>.
// When every conversation has ended, <body data-done> is set to "ok", or to the first error.
import { HttpAgent } from "@ag-ui/client";

const q = new URLSearchParams(location.search);
const GW = q.get("gw"), TOKEN = q.get("token");
const root = document.getElementById("conversations");

function render(name, agent, error) {
  const section = document.createElement("section");
  section.className = "conversation";
  section.dataset.name = name;
  section.dataset.status = error ? "error" : "ok";
  if (error) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = String(error && error.message ? error.message : error);
    section.appendChild(p);
  }
  for (const m of agent.messages) {
    const div = document.createElement("div");
    div.className = "message";
    div.dataset.role = m.role;
    div.dataset.id = m.id;
    if (typeof m.content === "string" && m.content !== "") {
      const text = document.createElement("span");
      text.className = "content";
      text.textContent = m.content;
      div.appendChild(text);
    }
    for (const c of m.toolCalls ?? []) {
      const call = document.createElement("code");
      call.className = "tool-call";
      call.dataset.name = c.function.name;
      call.dataset.id = c.id;
      call.textContent = c.function.arguments;
      div.appendChild(call);
    }
    if (m.role === "tool") div.dataset.toolCallId = m.toolCallId;
    section.appendChild(div);
  }
  root.appendChild(section);
}

async function conversation(name, messages, tools = []) {
  const agent = new HttpAgent({
    url: `${GW}/agents/demo/runs`,
    threadId: `browser-${name}-${Math.random().toString(16).slice(2)}`,
    headers: { Authorization: `Bearer ${TOKEN}` },
    initialMessages: messages,
  });
  const abortController = new AbortController();
  const timer = setTimeout(() => abortController.abort(), 10000);
  let error = null;
  try {
    await agent.runAgent({ tools, abortController });
  } catch (e) {
    error = e;
  } finally {
    clearTimeout(timer);
  }
  render(name, agent, error);
  return error;
}

const user = (id, content) => ({ id, role: "user", content });
async function main() {
  const errors = [];
  errors.push(await conversation("text", [user("m1", "Hello")]));
  errors.push(await conversation("server-tool", [user("m1", "What is the weather in Paris?")]));
  errors.push(await conversation("frontend-tool", [user("m1", "Search my local files for report")], [
    { name: "search_local_files", description: "Search files on this computer",
      parameters: { type: "object", properties: { keyword: { type: "string" } }, required: ["keyword"] } },
  ]));
  // A message over the gateway's body limit: the run fails, and the page can read why (the HTTP edge's
  // 413 carries the CORS fields), as the client reports an HTTP error ("HTTP 413: {…}"). Not counted above.
  await conversation("too-large", [user("m1", "x".repeat(100000))]);
  const first = errors.find((e) => e);
  document.body.dataset.done = first ? `error: ${first.message ?? first}` : "ok";
}
main().catch((e) => { document.body.dataset.done = `error: ${e.message ?? e}`; });
