/* Choosing a scenario from the request's messages and tools, and planning it. The matching is
 * deliberately simple and deterministic: the user's latest words, lowercased, against the tools'
 * names (whole names, or half of their tokens); arguments come from the tools' JSON Schema. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/common.h"

#include "run.h"
#include "scenarios.h"
#include "util.h"

#define ECHO_MAX 512 /* bytes of the user's text echoed back */
/* A message or tool-call id: msg_<n>, call_<nnn> or msg_tool_<n> (under 32 bytes), and with ids=run
 * "-" and at most ID_RUN_MAX bytes of the runId. */
#define ID_RUN_MAX 256
#define ID_LEN     (32 + 1 + ID_RUN_MAX + 1)

static bool is_alnum(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (unsigned char)ch >= 0x80;
}

/* Length of the longest prefix of <s> (length <len>) that is at most <max> bytes and does not split
 * a UTF-8 sequence. */
static size_t utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

/* Makes into <buf> (ID_LEN bytes) the id <prefix><n> (<n> with at least <width> digits), followed
 * with ids=run by "-<runId>" (its first ID_RUN_MAX bytes, a UTF-8 sequence never cut), so that it
 * is new in every run (enum ids). */
static void make_id(const struct run *r, char *buf, const char *prefix, int width, size_t n)
{
    int len = snprintf(buf, ID_LEN, "%s%0*zu", prefix, width, n);

    if (r->k.ids != IDS_RUN || len < 0 || len >= 32)
        return;
    snprintf(buf + len, ID_LEN - (size_t)len, "-%.*s",
             (int)utf8_cut(r->run_id, strlen(r->run_id), ID_RUN_MAX), r->run_id);
}

/* True when <word> occurs in <text> (both lowercase) bounded by non-alphanumerics. */
static bool has_word(const char *text, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        bool left = p == text || !is_alnum(p[-1]);
        bool right = !is_alnum(p[wl]);
        if (left && right)
            return true;
    }
    return false;
}

/* The text of a message: its string content, or its text parts joined by spaces. Returns a new
 * string. */
static char *message_text(const json_t *msg)
{
    const json_t *content = json_object_get(msg, "content");
    struct evbuffer *b;
    size_t i, n;
    const json_t *part;
    char *out;

    if (json_is_string(content))
        return agw_xstrndup(json_string_value(content), json_string_length(content));
    if (!json_is_array(content))
        return agw_xstrdup("");
    b = evbuffer_new();
    json_array_foreach(content, i, part)
    {
        const json_t *t = json_object_get(part, "text");
        if (json_is_string(t)) {
            if (evbuffer_get_length(b) > 0)
                evbuffer_add(b, " ", 1);
            evbuffer_add(b, json_string_value(t), json_string_length(t));
        }
    }
    n = evbuffer_get_length(b);
    out = agw_xmalloc(n + 1);
    evbuffer_remove(b, out, n);
    out[n] = '\0';
    evbuffer_free(b);
    return out;
}

static bool is_confirm_tool(const char *name)
{
    char *l = str_lower(name);
    bool yes = strstr(l, "confirm") != NULL;
    free(l);
    return yes;
}

/* Frontend tools: execute absent or "frontend" (backend tools run where they are defined, not
 * here). */
static bool is_frontend_tool(const json_t *tool)
{
    const char *ex = str_field(tool, "execute");
    return str_field(tool, "name") && (!ex || strcmp(ex, "frontend") == 0);
}

static const char *const stop_words[] = {
    "the",  "and",   "for",  "with", "help",  "please", "can",  "could", "you",  "your",  "our",
    "use",  "using", "tool", "find", "look",  "show",   "what", "whats", "this", "that",  "some",
    "all",  "any",   "from", "into", "about", "get",    "let",  "want",  "need", "would", "like",
    "tell", "give",  "my",   "me",   "set",   "run",    "are",  "is",    "it",   "of",    "to",
};

static bool is_stop_word(const char *w, size_t len)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(stop_words); i++) {
        if (strlen(stop_words[i]) == len && memcmp(stop_words[i], w, len) == 0)
            return true;
    }
    return false;
}

/* Splits a tool name into lowercase tokens (snake_case, kebab-case, camelCase), without stop words.
 */
static size_t name_tokens(const char *name, char toks[][32], size_t max)
{
    size_t n = 0, len = 0;
    char cur[32];

    for (const char *p = name;; p++) {
        bool boundary = *p == '\0' || *p == '_' || *p == '-' || *p == ' ' ||
                        (*p >= 'A' && *p <= 'Z' && p > name && p[-1] >= 'a' && p[-1] <= 'z');
        if (boundary && len > 0) {
            if (!is_stop_word(cur, len) && n < max) {
                memcpy(toks[n], cur, len);
                toks[n][len] = '\0';
                n++;
            }
            len = 0;
        }
        if (*p == '\0')
            break;
        if (*p != '_' && *p != '-' && *p != ' ' && len < sizeof(cur) - 1)
            cur[len++] = ascii_lower(*p);
    }
    return n;
}

/* True when the lowercase user text asks for <name>: it names it, or mentions at least half of its
 * tokens. */
static bool text_matches_tool(const char *lower_text, const char *name)
{
    char toks[8][32];
    size_t n, hits = 0;
    char *lname = str_lower(name);
    bool named = strstr(lower_text, lname) != NULL;

    free(lname);
    if (named)
        return true;
    n = name_tokens(name, toks, AGW_ARRAY_LEN(toks));
    for (size_t i = 0; i < n; i++) {
        /* "files" matches "file", "locally" matches "local": compare on the token's first 4+ bytes
         */
        size_t tl = strlen(toks[i]);
        if (tl > 4 && toks[i][tl - 1] == 's')
            toks[i][--tl] = '\0';
        if (tl >= 3 && strstr(lower_text, toks[i]))
            hits++;
    }
    return n > 0 && hits * 2 >= n;
}

/* The first word of <lower_text> worth using as a search keyword: not a stop word, not part of the
 * tool's name. Writes it into <out>; "demo" when there is none. */
static void pick_keyword(const char *lower_text, const char *tool, char *out, size_t outlen)
{
    char toks[8][32];
    size_t ntok = name_tokens(tool, toks, AGW_ARRAY_LEN(toks));
    const char *p = lower_text;

    while (*p) {
        const char *w;
        size_t len;
        bool skip = false;

        while (*p && !is_alnum(*p))
            p++;
        w = p;
        while (*p && is_alnum(*p))
            p++;
        len = (size_t)(p - w);
        if (len < 3 || is_stop_word(w, len))
            continue;
        for (size_t i = 0; i < ntok && !skip; i++) {
            size_t tl = strlen(toks[i]), cmp = tl < len ? tl : len;
            if (cmp > 4)
                cmp = 4;
            skip = cmp >= 3 && strncmp(w, toks[i], cmp) == 0;
        }
        if (skip)
            continue;
        snprintf(out, outlen, "%.*s", (int)(len < outlen ? len : outlen - 1), w);
        return;
    }
    snprintf(out, outlen, "demo");
}

/* The city of a weather question: the word after " in ", capitalised; "Beijing" when there is none.
 */
static void pick_city(const char *text, char *out, size_t outlen)
{
    char *lower = str_lower(text);
    const char *in = strstr(lower, " in ");
    size_t len = 0;

    snprintf(out, outlen, "Beijing");
    if (in) {
        const char *w = text + (in - lower) + 4;
        while (w[len] && is_alnum(w[len]) && len < outlen - 1)
            len++;
        if (len > 0) {
            memcpy(out, w, len);
            out[len] = '\0';
            if (out[0] >= 'a' && out[0] <= 'z')
                out[0] = (char)(out[0] - 'a' + 'A');
        }
    }
    free(lower);
}

/* Arguments for a frontend tool, made from its JSON-Schema parameters (an object, or a string
 * holding one, as legacy clients send) and the user's text. Returns a new compact JSON string. */
static char *tool_args(const json_t *tool, const char *text, const char *lower_text)
{
    const json_t *params = json_object_get(tool, "parameters");
    json_t *parsed = NULL, *args = json_object();
    json_t *props, *prop;
    const char *key;
    char *out;

    if (json_is_string(params))
        params = parsed = json_loads(json_string_value(params), 0, NULL);
    props = json_object_get(params, "properties");
    json_object_foreach(props, key, prop)
    {
        const char *type = str_field(prop, "type");
        const json_t *en = json_object_get(prop, "enum");
        char word[128];

        if (json_is_array(en) && json_array_size(en) > 0) {
            json_object_set(args, key, json_array_get(en, 0));
        } else if (!type || strcmp(type, "string") == 0) {
            if (strstr(key, "city") || strstr(key, "location"))
                pick_city(text, word, sizeof(word));
            else
                pick_keyword(lower_text, str_field(tool, "name"), word, sizeof(word));
            json_object_set_new(args, key, json_string(word));
        } else if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
            json_object_set_new(args, key, json_integer(1));
        } else if (strcmp(type, "boolean") == 0) {
            json_object_set_new(args, key, json_true());
        }
    }
    out = json_dumps(args, JSON_COMPACT);
    json_decref(args);
    json_decref(parsed);
    return out ? out : agw_xstrdup("{}");
}

/* Classifies a confirmation tool's answer: true = approved. Accepts true/false, "yes"/"no",
 * {"approved":bool} (or confirmed/accepted/allowed), {"status"|"decision":"…"} and plain words.
 * Anything unrecognised is a denial: a demo should not "delete" on a doubt. */
static bool decision_approved(const char *content)
{
    static const char *const yes[] = {"true",     "yes",      "y",       "ok",        "okay",
                                      "approve",  "approved", "confirm", "confirmed", "accept",
                                      "accepted", "allow",    "allowed", "proceed",   "go"};
    static const char *const bool_keys[] = {"approved", "confirmed", "accepted", "allowed", "ok"};
    static const char *const str_keys[] = {"status", "decision", "action", "answer", "result"};
    json_t *j = json_loads(content, JSON_DECODE_ANY, NULL);
    char word[64];
    const char *s = content;
    bool approved = false;

    if (j) {
        s = NULL;
        if (json_is_boolean(j)) {
            approved = json_is_true(j);
        } else if (json_is_string(j)) {
            s = json_string_value(j);
        } else if (json_is_object(j)) {
            for (size_t i = 0; i < AGW_ARRAY_LEN(bool_keys) && !s; i++) {
                const json_t *v = json_object_get(j, bool_keys[i]);
                if (json_is_boolean(v)) {
                    approved = json_is_true(v);
                    json_decref(j);
                    return approved;
                }
            }
            for (size_t i = 0; i < AGW_ARRAY_LEN(str_keys) && !s; i++)
                s = str_field(j, str_keys[i]);
        }
    }
    if (s) {
        size_t n = 0;
        while (*s == ' ' || *s == '"')
            s++;
        while (s[n] && is_alnum(s[n]) && n < sizeof(word) - 1) {
            word[n] = ascii_lower(s[n]);
            n++;
        }
        word[n] = '\0';
        for (size_t i = 0; i < AGW_ARRAY_LEN(yes); i++)
            approved = approved || strcmp(word, yes[i]) == 0;
    }
    json_decref(j);
    return approved;
}

/* The confirmation request derived from the user's text: "Delete all temporary files" gives the
 * action "delete temporary files" (the human-in-the-loop scenario, doc/demo-agent.md). */
static char *confirm_action(const char *text)
{
    char *l = str_lower(text), *out;
    size_t n = strlen(l);
    char *p = l, *all;

    while (n > 0 && (l[n - 1] == '.' || l[n - 1] == '!' || l[n - 1] == '?' || l[n - 1] == ' '))
        l[--n] = '\0';
    if (strncmp(p, "please ", 7) == 0)
        p += 7;
    /* "delete all the files" → "delete files", so that "15 <what>" reads well */
    static const char *const fillers[] = {" all ", " the "}; /* each 4 bytes + a space kept */
    for (size_t i = 0; i < AGW_ARRAY_LEN(fillers); i++) {
        if ((all = strstr(p, fillers[i])) != NULL)
            memmove(all, all + 4, strlen(all + 4) + 1);
    }
    n = utf8_cut(p, strlen(p), 200);
    out = agw_xstrndup(p, n);
    free(l);
    return out;
}

static void sfmt(char *buf, size_t len, const char *fmt, ...) AGW_PRINTF(3, 4);
static void sfmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* The answer to tool <name> (called with <args>; both may be NULL) returning <content>: a
 * confirmation's outcome, or a text that uses the result. Returns the outcome's scenario name. */
static const char *followup_text(const char *name, const char *args, const char *content,
                                 char *text, size_t textlen)
{
    const char *outcome;
    size_t j;

    if (name && is_confirm_tool(name)) {
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        const char *action = str_field(a, "action");
        const json_t *count = json_object_get(a, "count");
        bool ok = decision_approved(content);

        outcome = ok ? "confirm-approved" : "confirm-denied";
        if (!action)
            sfmt(text, textlen,
                 ok ? "Done: the action was approved and carried out."
                    : "Cancelled: the action was not carried out.");
        else if (ok && strncmp(action, "delete ", 7) == 0 && json_is_integer(count))
            sfmt(text, textlen, "Successfully deleted %" JSON_INTEGER_FORMAT " %s.",
                 json_integer_value(count), action + 7);
        else if (ok && strncmp(action, "delete ", 7) == 0)
            sfmt(text, textlen, "Successfully deleted %s.", action + 7);
        else if (ok)
            sfmt(text, textlen, "Done: %s.", action);
        else
            sfmt(text, textlen, "Cancelled: I did not %s.", action);
        json_decref(a);
    } else {
        json_t *res = json_loads(content, 0, NULL);
        size_t len;

        outcome = "tool-result";
        if (json_is_array(res) && json_array_size(res) > 0) {
            bool files = name && strstr(name, "file");
            size_t cnt = json_array_size(res);
            const json_t *it;
            len = (size_t)snprintf(text, textlen, "Found %zu %s: ", cnt,
                                   files ? (cnt == 1 ? "file" : "files")
                                         : (cnt == 1 ? "result" : "results"));
            json_array_foreach(res, j, it)
            {
                char *s = json_is_string(it) ? agw_xstrdup(json_string_value(it))
                                             : json_dumps(it, JSON_COMPACT | JSON_ENCODE_ANY);
                if (len < textlen)
                    len +=
                        (size_t)snprintf(text + len, textlen - len, "%s%s",
                                         j == 0 ? "" : (j + 1 == cnt ? " and " : ", "), s ? s : "");
                free(s);
            }
        } else {
            size_t cl = utf8_cut(content, strlen(content), ECHO_MAX);
            sfmt(text, textlen, "The %s tool returned: %.*s", name ? name : "frontend", (int)cl,
                 content);
        }
        json_decref(res);
        /* snprintf may have cut a UTF-8 sequence at the buffer's end */
        len = strlen(text);
        text[utf8_cut(text, len, textlen - 8)] = '\0';
    }
    return outcome;
}

/* Appends the answer to tool <name> returning <content> (see followup_text; <content> may be NULL)
 * as text message msg_<msg_no>, then the run's end. Scenario (a) and a waiting run's decision share
 * it, so that both answer a tool alike. Returns the outcome's scenario name. */
const char *plan_followup(struct run *r, const char *name, const char *args, const char *content,
                          size_t msg_no)
{
    char id[ID_LEN], text[1024];
    const char *texts[1] = {text};
    const char *outcome = followup_text(name, args, content ? content : "", text, sizeof(text));

    make_id(r, id, "msg_", 1, msg_no);
    plan_text(r, id, texts, 1, true);
    plan_end(r);
    return outcome;
}

/* (a) The last message is a tool result: answer with a text that uses it. */
static void scenario_tool_followup(struct run *r, const json_t *messages, const json_t *last,
                                   size_t n)
{
    const char *call_id = str_field(last, "toolCallId");
    const char *content = str_field(last, "content");
    const char *name = NULL, *args = NULL;
    const json_t *m, *tc;
    size_t i, j;

    json_array_foreach(messages, i, m)
    {
        json_array_foreach(json_object_get(m, "toolCalls"), j, tc)
        {
            const json_t *fn = json_object_get(tc, "function");
            if (call_id && str_field(tc, "id") && strcmp(str_field(tc, "id"), call_id) == 0) {
                name = str_field(fn, "name");
                args = str_field(fn, "arguments");
            }
        }
    }
    plan_begin(r);
    r->scenario = plan_followup(r, name, args, content, n + 1);
}

/* After a frontend tool call: wait_decision=1 keeps the stream open for the decision (EV_WAIT),
 * otherwise the run ends and the frontend answers in a new run. */
static void plan_end_or_wait(struct run *r, const char *call_id, const char *name, const char *args,
                             size_t n)
{
    if (!r->k.wait_decision) {
        plan_end(r);
        return;
    }
    r->pending_call = agw_xstrdup(call_id);
    r->pending_name = agw_xstrdup(name);
    r->pending_args = agw_xstrdup(args);
    r->followup_msg = n + 2; /* msg_{n+1} may be this run's own text */
    plan_add(r, EV_WAIT);
}

/* (b) A destructive request with confirmAction available: ask for confirmation, then end or wait
 * (plan_end_or_wait). */
static void scenario_confirm(struct run *r, const char *tool, const char *text, size_t n)
{
    char *action = confirm_action(text);
    json_t *args = json_object();
    char msg_id[ID_LEN], call_id[ID_LEN], say[512];
    const char *texts[1] = {say};
    char *args_s;

    r->scenario = "confirm";
    json_object_set_new(args, "action", json_string(action));
    if (strncmp(action, "delete ", 7) == 0) {
        json_object_set_new(args, "count", json_integer(15));
        sfmt(say, sizeof(say), "About to delete 15 %s", action + 7);
    } else {
        sfmt(say, sizeof(say), "About to %s", action);
    }
    args_s = json_dumps(args, JSON_COMPACT);
    make_id(r, msg_id, "msg_", 1, n + 1);
    make_id(r, call_id, "call_", 3, 3 + 3 * (n - 1));
    plan_begin(r);
    plan_text(r, msg_id, texts, 1, false);
    if (!r->k.stall) {
        plan_tool_call(r, call_id, tool, msg_id, args_s ? args_s : "{}");
        plan_end_or_wait(r, call_id, tool, args_s ? args_s : "{}", n);
    } else {
        plan_end(r);
    }
    free(args_s);
    json_decref(args);
    free(action);
}

/* (c) A frontend tool the user asked for: call it; the frontend answers in the next request, or in
 * a decision for this run when it waits. */
static void scenario_frontend(struct run *r, const json_t *tool, const char *text,
                              const char *lower, size_t n)
{
    char call_id[ID_LEN];
    char *args = tool_args(tool, text, lower);

    r->scenario = "frontend-tool";
    make_id(r, call_id, "call_", 3, 2 + 3 * (n - 1));
    plan_begin(r);
    plan_tool_call(r, call_id, str_field(tool, "name"), NULL, args);
    plan_end_or_wait(r, call_id, str_field(tool, "name"), args, n);
    free(args);
}

/* (d) Weather: a server-side tool, called and answered here. */
static void scenario_weather(struct run *r, const char *text, size_t n)
{
    char city[64], msg1[ID_LEN], msg2[ID_LEN], call_id[ID_LEN], result_id[ID_LEN], args[128];
    char result[256], say[256];
    const char *intro[1] = {"Let me check"};
    const char *final[1] = {say};
    json_t *j;
    char *s;
    struct step *st;

    r->scenario = "weather";
    pick_city(text, city, sizeof(city));
    make_id(r, msg1, "msg_", 1, n + 1);
    make_id(r, msg2, "msg_", 1, n + 2);
    make_id(r, call_id, "call_", 3, 1 + 3 * (n - 1));
    make_id(r, result_id, "msg_tool_", 1, n);
    j = json_pack("{s:s}", "city", city);
    s = json_dumps(j, JSON_COMPACT);
    snprintf(args, sizeof(args), "%s", s ? s : "{}");
    free(s);
    json_decref(j);
    j = json_pack("{s:s,s:s,s:i,s:s}", "city", city, "condition", "Sunny", "temperature", 25,
                  "unit", "C");
    s = json_dumps(j, JSON_COMPACT);
    snprintf(result, sizeof(result), "%s", s ? s : "{}");
    free(s);
    json_decref(j);
    sfmt(say, sizeof(say),
         "%s is sunny today, 25\xc2\xb0"
         "C.",
         city);

    plan_begin(r);
    plan_text(r, msg1, intro, 1, false);
    if (!r->k.stall) {
        plan_tool_call(r, call_id, "get_weather", msg1, args);
        st = plan_add(r, EV_TOOL_RESULT);
        st->id = agw_xstrdup(result_id);
        st->call_id = agw_xstrdup(call_id);
        st->text = agw_xstrdup(result);
        plan_text(r, msg2, final, 1, true);
    }
    plan_end(r);
}

/* The answer <id> of <n_texts> deltas as TEXT_MESSAGE_CHUNKs, only the first naming the message,
 * while a sub-agent (subagent=1) streams its own message as chunks of its lane between them: what
 * an orchestrating agent's stream looks like (n: the message number for the ids). */
static void plan_subagent_chat(struct run *r, const char *id, const char *const *texts,
                               size_t n_texts, size_t n)
{
    char sub[ID_LEN], sub_msg[ID_LEN];

    make_id(r, sub, "sub_", 1, n + 1);
    make_id(r, sub_msg, "sub_msg_", 1, n + 1);
    for (size_t i = 0; i < n_texts; i++) {
        json_t *ev = json_pack("{s:s, s:s}", "type", "TEXT_MESSAGE_CHUNK", "delta", texts[i]);
        if (i == 0)
            json_object_set_new(ev, "messageId", json_string(id));
        plan_literal(r, ev);
        if (i == 0) {
            plan_literal(r, json_pack("{s:s, s:s, s:s}", "type", "SUBAGENT_STARTED",
                                      "subagentRunId", sub, "name", "helper"));
            plan_literal(r, json_pack("{s:s, s:s, s:s, s:s}", "type", "TEXT_MESSAGE_CHUNK",
                                      "messageId", sub_msg, "subagentRunId", sub, "delta",
                                      "Looking "));
        } else if (i == 1) {
            plan_literal(r, json_pack("{s:s, s:s, s:s}", "type", "TEXT_MESSAGE_CHUNK",
                                      "subagentRunId", sub, "delta", "it up."));
            plan_literal(
                r, json_pack("{s:s, s:s}", "type", "SUBAGENT_FINISHED", "subagentRunId", sub));
        }
    }
}

/* (e) Conversation: a friendly reply echoing the user's text, over several deltas. */
static void scenario_chat(struct run *r, const char *text, const char *lower, size_t n)
{
    char id[ID_LEN], echo[ECHO_MAX + 8], plan[ID_LEN];
    const char *greet[] = {"Hello", "! How can I help you?"};
    const char *reply[] = {"Hello", "! You said: \"", echo, "\".", " How can I help you?"};
    size_t tl = strlen(lower);
    bool greeting;

    while (tl > 0 && !is_alnum(lower[tl - 1]))
        tl--;
    greeting = tl == 0 || (tl == 5 && strncmp(lower, "hello", 5) == 0) ||
               (tl == 2 && strncmp(lower, "hi", 2) == 0) ||
               (tl == 3 && strncmp(lower, "hey", 3) == 0);
    snprintf(echo, sizeof(echo), "%.*s", (int)utf8_cut(text, strlen(text), ECHO_MAX), text);
    r->scenario = "chat";
    make_id(r, id, "msg_", 1, n + 1);
    plan_begin(r);
    if (r->k.reasoning && r->k.dialect == DIALECT_AGUI) {
        const char *texts[] = {"The user said \"", echo, "\": answer kindly."};
        char span[ID_LEN], rid[ID_LEN];

        make_id(r, span, "reasoning_", 1, n + 1);
        make_id(r, rid, "thought_", 1, n + 1);
        plan_reasoning(r, span, rid, texts, AGW_ARRAY_LEN(texts));
    }
    if (r->k.activity && r->k.dialect == DIALECT_AGUI) {
        make_id(r, plan, "plan_", 1, n + 1);
        plan_activity(r, plan, false, "{\"steps\":[\"read\",\"answer\"],\"done\":0}");
    }
    if (r->k.subagent && r->k.dialect == DIALECT_AGUI)
        plan_subagent_chat(r, id, greeting ? greet : reply,
                           greeting ? AGW_ARRAY_LEN(greet) : AGW_ARRAY_LEN(reply), n);
    else if (greeting)
        plan_text(r, id, greet, AGW_ARRAY_LEN(greet), true);
    else
        plan_text(r, id, reply, AGW_ARRAY_LEN(reply), true);
    if (r->k.activity && r->k.dialect == DIALECT_AGUI)
        plan_activity(r, plan, true,
                      "[{\"op\":\"replace\",\"path\":\"/done\",\"value\":2},"
                      "{\"op\":\"add\",\"path\":\"/steps/-\",\"value\":\"done\"}]");
    plan_end(r);
}

/* Builds the run's plan from RunAgentInput <in>: the first matching scenario of (a)..(e). stall=1
 * always plays the conversation (it needs an open text message). */
void plan_build(struct run *r, const json_t *in)
{
    const json_t *messages = json_object_get(in, "messages");
    const json_t *tools = json_object_get(in, "tools");
    size_t n = json_is_array(messages) ? json_array_size(messages) : 0;
    const json_t *last = n ? json_array_get(messages, n - 1) : NULL;
    const json_t *m, *tool, *confirm = NULL, *frontend = NULL;
    char *text = NULL, *lower = NULL;
    size_t i;

    /* the user's latest words */
    for (i = n; i > 0; i--) {
        m = json_array_get(messages, i - 1);
        if (str_field(m, "role") && strcmp(str_field(m, "role"), "user") == 0) {
            text = message_text(m);
            break;
        }
    }
    if (!text)
        text = agw_xstrdup("");
    lower = str_lower(text);
    if (n == 0)
        n = 1; /* ids stay msg_2, call_00x as in the seed */

    if (!r->k.stall && last && str_field(last, "role") &&
        strcmp(str_field(last, "role"), "tool") == 0) {
        scenario_tool_followup(r, messages, last, n);
        goto out;
    }
    json_array_foreach(tools, i, tool)
    {
        const char *name = str_field(tool, "name");
        if (!is_frontend_tool(tool))
            continue;
        if (is_confirm_tool(name)) {
            if (!confirm)
                confirm = tool;
        } else if (!frontend && text_matches_tool(lower, name)) {
            frontend = tool;
        }
    }
    if (!frontend && has_word(lower, "use")) {
        json_array_foreach(tools, i, tool)
        {
            if (is_frontend_tool(tool) && !is_confirm_tool(str_field(tool, "name"))) {
                frontend = tool;
                break;
            }
        }
    }
    if (r->k.stall) {
        scenario_chat(r, text, lower, n);
    } else if (confirm &&
               (strstr(lower, "delete") || strstr(lower, "confirm") || strstr(lower, "remove") ||
                strstr(lower, "erase") || strstr(lower, "destroy") || strstr(lower, "drop "))) {
        scenario_confirm(r, str_field(confirm, "name"), text, n);
    } else if (frontend) {
        scenario_frontend(r, frontend, text, lower, n);
    } else if (strstr(lower, "weather")) {
        scenario_weather(r, text, n);
    } else {
        scenario_chat(r, text, lower, n);
    }
out:
    free(text);
    free(lower);
}
