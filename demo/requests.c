/* The routes and the agent POST (see requests.h). */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/log.h"

#include "demo.h"
#include "hitl.h"
#include "http.h"
#include "knobs.h"
#include "requests.h"
#include "run.h"
#include "scenarios.h"
#include "util.h"

/* Keeps the request for GET /_demo/last-request: header names lowercased, repeated headers joined
 * with
 * ", ", the body as the raw string (bytes that are not UTF-8 shown as '?'). */
static void record_request(struct conn *c, const char *path, const char *query)
{
    json_t *hdrs = json_object(), *req = json_object();
    size_t blen = evbuffer_get_length(c->body);
    const char *body = (const char *)evbuffer_pullup(c->body, -1);

    for (size_t i = 0; i < c->nhdrs; i++) {
        const char *name = c->hdrs[i].name, *val = c->hdrs[i].value;
        const json_t *prev = json_object_get(hdrs, name);
        json_t *v;
        if (json_is_string(prev)) {
            size_t n = json_string_length(prev) + strlen(val) + 3;
            char *joined = agw_xmalloc(n);
            snprintf(joined, n, "%s, %s", json_string_value(prev), val);
            v = json_str_lossy(joined, strlen(joined));
            free(joined);
        } else {
            v = json_str_lossy(val, strlen(val));
        }
        json_object_set_new(hdrs, name, v); /* names are tokens (ASCII), see parse_head */
    }
    json_object_set_new(req, "method", json_str_lossy(c->method, strlen(c->method)));
    json_object_set_new(req, "path", json_str_lossy(path, strlen(path)));
    json_object_set_new(req, "query", json_str_lossy(query, strlen(query)));
    json_object_set_new(req, "headers", hdrs);
    json_object_set_new(req, "body", json_str_lossy(body ? body : "", body ? blen : 0));
    json_decref(c->d->last_request);
    c->d->last_request = req;
}

/* An agent POST: validate, build the run, answer after first_byte_delay_ms. */
/* A legacy AG-Kit request (dialect=ag-kit) in the shape the scenarios read: conversationId is the
 * thread, tools' parameters (a JSON string) become objects, messages get ids, and a resume
 * {interruptId, payload} becomes the confirmation's tool call and its answer, as an AG-UI client
 * would have sent them. */
static void agkit_normalise(json_t *in)
{
    json_t *messages = json_object_get(in, "messages"), *tools = json_object_get(in, "tools");
    json_t *resume = json_object_get(in, "resume"), *m, *t;
    size_t i;

    if (json_is_string(json_object_get(in, "conversationId")))
        json_object_set(in, "threadId", json_object_get(in, "conversationId"));
    json_array_foreach(tools, i, t)
    {
        json_t *params = json_object_get(t, "parameters");
        json_t *parsed =
            json_is_string(params) ? json_loads(json_string_value(params), 0, NULL) : NULL;
        if (parsed != NULL)
            json_object_set_new(t, "parameters", parsed);
    }
    if (!json_is_array(messages)) {
        messages = json_array();
        json_object_set_new(in, "messages", messages);
    }
    if (json_is_object(resume) && json_is_string(json_object_get(resume, "interruptId"))) {
        json_t *id = json_object_get(resume, "interruptId");
        json_t *payload = json_object_get(resume, "payload");
        char *content =
            json_dumps(payload != NULL ? payload : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
        json_array_append_new(messages,
                              json_pack("{s:s,s:[{s:O,s:s,s:{s:s,s:s}}]}", "role", "assistant",
                                        "toolCalls", "id", id, "type", "function", "function",
                                        "name", "confirmAction", "arguments", "{}"));
        json_array_append_new(messages, json_pack("{s:s,s:O,s:s}", "role", "tool", "toolCallId", id,
                                                  "content", content ? content : "null"));
        free(content);
    }
    json_array_foreach(messages, i, m)
    {
        char id[32];
        if (json_is_object(m) && json_object_get(m, "id") == NULL) {
            snprintf(id, sizeof(id), "legacy_%zu", i + 1);
            json_object_set_new(m, "id", json_string(id));
        }
    }
}

static void handle_run(struct conn *c, const char *path, const char *query)
{
    struct demo *d = c->d;
    struct run *r = NULL;
    char err[256];
    json_t *in = NULL;
    json_error_t jerr;
    const char *tid, *rid;
    char hex[33];

    d->requests++;
    record_request(c, path, query);
    r = agw_xcalloc(1, sizeof(*r));
    knobs_init(&r->k);
    if (knobs_parse(&r->k, query, c->hdrs, c->nhdrs, err, sizeof(err)) < 0) {
        run_free(r);
        send_error(c, 400, err, false);
        return;
    }
    if (!r->k.status && evbuffer_get_length(c->body) == 0) {
        run_free(r);
        send_error(c, 400, "invalid JSON body: the body is empty", false);
        return;
    }
    if (!r->k.status) {
        in = json_loadb((const char *)evbuffer_pullup(c->body, -1), evbuffer_get_length(c->body), 0,
                        &jerr);
        if (!json_is_object(in)) {
            if (in)
                snprintf(err, sizeof(err), "invalid JSON body: expects an object");
            else
                snprintf(err, sizeof(err), "invalid JSON body: %s (line %d, column %d)", jerr.text,
                         jerr.line, jerr.column);
            json_decref(in);
            run_free(r);
            send_error(c, 400, err, false);
            return;
        }
    }
    if (in != NULL && r->k.dialect == DIALECT_AGKIT)
        agkit_normalise(in);
    tid = str_field(in, "threadId");
    rid = str_field(in, "runId");
    if (in && take_decision(c, in, (enum decision_mode)r->k.decision)) {
        json_decref(in);
        run_free(r);
        return;
    }
    if (tid && *tid) {
        r->thread_id = agw_xstrdup(tid);
    } else {
        agw_random_hex(hex, 16);
        r->thread_id = agw_xmalloc(40);
        snprintf(r->thread_id, 40, "thread_%s", hex);
    }
    if (rid && *rid) {
        r->run_id = agw_xstrdup(rid);
    } else {
        agw_random_hex(hex, 16);
        r->run_id = agw_xmalloc(40);
        snprintf(r->run_id, 40, "run_%s", hex);
    }
    r->batch = evbuffer_new();
    if (r->k.status)
        r->scenario = "status";
    else
        plan_build(r, in);
    json_decref(in);
    while (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
           r->steps[r->cur].count == 0)
        r->cur++;

    agw_log_info("conn %" PRIu64 ": %s %s -> run thread=%s run=%s scenario=%s", c->id, c->method,
                 c->target, r->thread_id, r->run_id, r->scenario);
    c->run = r;
    c->bytewise = r->k.bytewise != 0;
    r->seq = ++d->run_seq;
    d->active_streams++;
    bufferevent_set_timeouts(c->bev, NULL, NULL); /* a stalled or paced stream is not idle */
    set_state(c, CONN_ST_DELAY);
    arm_timer(c, (uint64_t)r->k.first_byte_delay_ms);
}

void handle_request(struct conn *c)
{
    static const char method_not_allowed[] = "{\"error\":\"method not allowed\"}";
    struct demo *d = c->d;
    const char *q = strchr(c->target, '?');
    char *path = q ? agw_xstrndup(c->target, (size_t)(q - c->target)) : agw_xstrdup(c->target);
    const char *query = q ? q + 1 : "";
    bool get = strcmp(c->method, "GET") == 0 || strcmp(c->method, "HEAD") == 0;

    if (strcmp(path, "/healthz") == 0 || strncmp(path, "/_demo/", 7) == 0) {
        if (!get) {
            send_response(c, 405, "application/json", method_not_allowed,
                          strlen(method_not_allowed), "Allow: GET, HEAD\r\n", false);
        } else if (strcmp(path, "/healthz") == 0) {
            agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
            send_json(c, 200, json_pack("{s:s}", "status", "ok"), "", false);
        } else if (strcmp(path, "/_demo/stats") == 0) {
            agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
            send_json(c, 200,
                      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "requests",
                                (json_int_t)d->requests, "active_streams",
                                (json_int_t)d->active_streams, "client_closed",
                                (json_int_t)d->client_closed, "completed", (json_int_t)d->completed,
                                "dropped", (json_int_t)d->dropped, "connections",
                                (json_int_t)d->connections, "waiting", (json_int_t)d->waiting,
                                "decisions", (json_int_t)d->decisions, "accepted",
                                (json_int_t)d->accepted),
                      "", false);
        } else if (strcmp(path, "/_demo/last-request") == 0) {
            if (d->last_request) {
                agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
                send_json(c, 200, json_incref(d->last_request), "", false);
            } else {
                send_error(c, 404, "no request recorded yet", false);
            }
        } else {
            send_error(c, 404, "not found", false);
        }
    } else if (strcmp(c->method, "POST") != 0) {
        agw_log_info("conn %" PRIu64 ": %s %s -> 405", c->id, c->method, c->target);
        send_response(c, 405, "application/json", method_not_allowed, strlen(method_not_allowed),
                      "Allow: POST\r\n", false);
    } else {
        handle_run(c, path, query);
    }
    free(path);
}
