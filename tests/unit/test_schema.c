/* What the official client accepts of an event (src/schema.c): each rule of the AG-UI 1.0
 * schemas as the client reads them, what it drops instead of refusing, and the fast check of flat
 * events against the full one. tests/interop plays the same kinds of events through the real
 * client. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "agw/schema.h"

/* Single quotes in the tables below stand for double quotes. */
static json_t *parse(const char *text)
{
    char buf[2048];
    json_error_t err;
    size_t n = strlen(text);
    json_t *v;

    cr_assert_lt(n, sizeof(buf));
    for (size_t i = 0; i <= n; i++)
        buf[i] = text[i] == '\'' ? '"' : text[i];
    v = json_loads(buf, 0, &err);
    cr_assert_not_null(v, "%s: %s", buf, err.text);
    return v;
}

/* NULL: accepted; else the words the refusal must hold. */
static void expect(const char *event, const char *refusal)
{
    json_t *ev = parse(event);
    char why[320] = "";
    bool ok = agw_schema_check(ev, why, sizeof(why));

    if (refusal == NULL)
        cr_expect(ok, "%s refused: %s", event, why);
    else
        cr_expect(!ok && strstr(why, refusal) != NULL, "%s: expected a refusal with «%s», got %s",
                  event, refusal, ok ? "none" : why);
    json_decref(ev);
}

Test(schema, lifecycle_events_need_their_members_of_their_kinds)
{
    expect("{'type':'TEXT_MESSAGE_START','messageId':'m'}", NULL);
    expect("{'type':'TEXT_MESSAGE_START','messageId':'m','role':'user','name':'n'}", NULL);
    expect("{'type':'TEXT_MESSAGE_START','messageId':'m','role':'tool'}",
           "TEXT_MESSAGE_START \"role\" must be one of developer, system, assistant, user");
    expect("{'type':'TEXT_MESSAGE_START','messageId':'m','name':5}",
           "TEXT_MESSAGE_START without a string \"name\"");
    expect("{'type':'TEXT_MESSAGE_START'}", "TEXT_MESSAGE_START without a string \"messageId\"");
    expect("{'type':'TEXT_MESSAGE_CONTENT','messageId':'m','delta':''}", NULL);
    expect("{'type':'TEXT_MESSAGE_CONTENT','messageId':'m'}",
           "TEXT_MESSAGE_CONTENT without a string \"delta\"");
    expect("{'type':'TOOL_CALL_START','toolCallId':'c','toolCallName':'f','parentMessageId':'m'}",
           NULL);
    expect("{'type':'TOOL_CALL_START','toolCallId':'c'}",
           "TOOL_CALL_START without a string \"toolCallName\"");
    expect("{'type':'TOOL_CALL_START','toolCallId':'c','toolCallName':'f','parentMessageId':1}",
           "without a string \"parentMessageId\"");
    expect("{'type':'TOOL_CALL_RESULT','messageId':'r','toolCallId':'c','content':'x'}", NULL);
    expect("{'type':'TOOL_CALL_RESULT','messageId':'r','toolCallId':'c','content':'x','role':"
           "'assistant'}",
           "TOOL_CALL_RESULT \"role\" must be \"tool\"");
    expect("{'type':'TOOL_CALL_RESULT','messageId':'r','toolCallId':'c','content':{}}",
           "\"content\" must be a string or an array of content parts");
    expect("{'type':'REASONING_MESSAGE_START','messageId':'r','role':'reasoning'}", NULL);
    expect("{'type':'REASONING_MESSAGE_START','messageId':'r'}",
           "REASONING_MESSAGE_START \"role\" is missing");
    expect("{'type':'REASONING_ENCRYPTED_VALUE','subtype':'x','entityId':'e','encryptedValue':'v'}",
           "\"subtype\" must be one of tool-call, message");
    expect("{'type':'STEP_STARTED','stepName':1}", "STEP_STARTED without a string \"stepName\"");
    expect("{'type':'SUBAGENT_STARTED','subagentRunId':'s','name':'n'}", NULL);
    expect("{'type':'SUBAGENT_STARTED','name':'n'}", "without a string \"subagentRunId\"");
    expect("{'type':'SUBAGENT_ERROR','subagentRunId':'s'}", "without a string \"message\"");
    expect("{'type':'RUN_ERROR','message':'m','code':5}", "RUN_ERROR without a string \"code\"");
}

Test(schema, every_event_may_carry_metadata_an_attribution_and_a_raw_event)
{
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','metadata':{'a':null},'rawEvent':{},"
           "'subagentRunId':'s','timestamp':1}",
           NULL);
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','metadata':'x'}",
           "TEXT_MESSAGE_END \"metadata\" must be an object");
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','metadata':[1]}",
           "\"metadata\" must be an object");
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','subagentRunId':5}",
           "without a string \"subagentRunId\"");
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','rawEvent':null}",
           "\"rawEvent\" must not be null");
    /* (a run's events name no sub-agent: the client drops the member) */
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','subagentRunId':5}", NULL);
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[],'subagentRunId':5}", NULL);
}

Test(schema, what_the_client_drops_is_not_refused)
{
    /* members no schema names, events of no type the protocol has */
    expect("{'type':'TEXT_MESSAGE_END','messageId':'m','extra':null,'deep':{'x':[null]}}", NULL);
    expect("{'type':'THINKING_START','anything':null}", NULL);
    expect("{'type':'text_message_start'}", NULL);
    /* an element of no known kind: a message of an unknown role, or none; a content part of an
     * unknown type, or whose source is of one; a patch operation of an unknown op */
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'robot','content':5},"
           "{'content':'no role'}]}",
           NULL);
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'user','content':[{'type':"
           "'blob'},{'type':'image','source':{'type':'ftp'}},{'type':'text','text':'x'}]}]}",
           NULL);
    expect("{'type':'STATE_DELTA','delta':[{'op':'frob','path':5}]}", NULL);
    /* an optional member of an unknown kind */
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'weird'}}", NULL);
    expect("{'type':'SUBAGENT_FINISHED','subagentRunId':'s','outcome':{'type':'weird'}}", NULL);
}

Test(schema, nulls_are_refused_but_where_the_protocol_gives_them_a_meaning)
{
    expect("{'type':'STATE_SNAPSHOT','snapshot':null}", NULL);
    expect("{'type':'CUSTOM','name':'n','value':null}", NULL);
    expect("{'type':'RAW','event':null}", NULL);
    expect("{'type':'STATE_DELTA','delta':[{'op':'add','path':'/a','value':null}]}", NULL);
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','input':{'threadId':'t','runId':'r',"
           "'messages':[],'state':null}}",
           NULL);
    expect("{'type':'STATE_SNAPSHOT'}", "STATE_SNAPSHOT \"snapshot\" is missing");
    expect("{'type':'CUSTOM','name':'n'}", "CUSTOM \"value\" is missing");
    expect("{'type':'RAW'}", "RAW \"event\" is missing");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','result':null}",
           "RUN_FINISHED \"result\" must not be null");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'user','content':'x','name':"
           "null}]}",
           "MESSAGES_SNAPSHOT without a string \"messages[0].name\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'user','content':'x',"
           "'subagentRunId':null}]}",
           "without a string \"messages[0].subagentRunId\"");
    cr_expect(agw_schema_keeps_null("STATE_SNAPSHOT", "snapshot"));
    cr_expect(agw_schema_keeps_null("CUSTOM", "value"));
    cr_expect(agw_schema_keeps_null("RAW", "event"));
    cr_expect(!agw_schema_keeps_null("CUSTOM", "name"));
    cr_expect(!agw_schema_keeps_null("RUN_FINISHED", "result"));
    cr_expect(!agw_schema_keeps_null("STATE_DELTA", "snapshot"));
}

Test(schema, messages_are_read_by_their_role)
{
    expect("{'type':'MESSAGES_SNAPSHOT','messages':["
           "{'id':'d','role':'developer','content':'x'},{'id':'s','role':'system','content':'x'},"
           "{'id':'a','role':'assistant','toolCalls':[{'id':'c','type':'function','function':{"
           "'name':'f','arguments':'{}'}}]},"
           "{'id':'u','role':'user','content':[{'type':'text','text':'x'},{'type':'image','source':"
           "{'type':'url','value':'u'}},{'type':'document','source':{'type':'data','value':'v',"
           "'mimeType':'m'}}]},"
           "{'id':'t','role':'tool','content':'x','toolCallId':'c','error':'e'},"
           "{'id':'v','role':'activity','activityType':'p','content':{}},"
           "{'id':'r','role':'reasoning','content':'x','encryptedValue':'e'}]}",
           NULL);
    expect("{'type':'MESSAGES_SNAPSHOT','messages':{}}",
           "MESSAGES_SNAPSHOT \"messages\" must be an array");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'role':'user','content':'x'}]}",
           "without a string \"messages[0].id\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[5]}", "\"messages[0]\" must be an object");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'s','role':'system'}]}",
           "without a string \"messages[0].content\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'a','role':'assistant','content':null}]}",
           "without a string \"messages[0].content\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'a','role':'assistant','toolCalls':[{"
           "'id':'c','type':'function','function':{'name':'f'}}]}]}",
           "without a string \"messages[0].toolCalls[0].function.arguments\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'a','role':'assistant','toolCalls':[{"
           "'id':'c','type':'func','function':{'name':'f','arguments':''}}]}]}",
           "\"messages[0].toolCalls[0].type\" must be \"function\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'user','content':[{'type':"
           "'text'}]}]}",
           "without a string \"messages[0].content[0].text\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u','role':'user','content':[{'type':"
           "'image','source':{'type':'data','value':'v'}}]}]}",
           "without a string \"messages[0].content[0].source.mimeType\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'t','role':'tool','content':'x'}]}",
           "without a string \"messages[0].toolCallId\"");
    expect("{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'v','role':'activity','activityType':'p',"
           "'content':[]}]}",
           "\"messages[0].content\" must be an object");
}

Test(schema, a_runs_input_outcome_and_usage)
{
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','input':{'threadId':'t','runId':'r',"
           "'messages':[],'tools':[{'name':'n','description':'d','parameters':{}}],'context':[{"
           "'description':'d','value':'v'}],'resume':[{'interruptId':'i','status':'resolved'}]}}",
           NULL);
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','input':{'messages':[]}}",
           "RUN_STARTED without a string \"input.threadId\"");
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','input':{'threadId':'t','runId':'r'}}",
           "RUN_STARTED \"input.messages\" is missing");
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','input':{'threadId':'t','runId':'r',"
           "'messages':[],'resume':[{'interruptId':'i','status':'maybe'}]}}",
           "\"input.resume[0].status\" must be one of resolved, cancelled");
    expect("{'type':'RUN_STARTED','threadId':'t','runId':'r','parentRunId':3}",
           "without a string \"parentRunId\"");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'success',"
           "'pendingToolCallIds':['c']},'usage':[{'model':'m','inputTokens':10,'totalTokens':0}]}",
           NULL);
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':'success'}",
           "RUN_FINISHED \"outcome\" must be an object");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'interrupt',"
           "'interrupts':[]}}",
           "\"outcome.interrupts\" must not be empty");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'interrupt',"
           "'interrupts':[{'id':'i'}]}}",
           "without a string \"outcome.interrupts[0].reason\"");
    /* an interrupt says which sub-agent run asked, as a string (null is refused too) */
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'interrupt',"
           "'interrupts':[{'id':'i','reason':'r','subagentRunId':'s'}]}}",
           NULL);
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'interrupt',"
           "'interrupts':[{'id':'i','reason':'r','subagentRunId':null}]}}",
           "without a string \"outcome.interrupts[0].subagentRunId\"");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','outcome':{'type':'success',"
           "'pendingToolCallIds':[1]}}",
           "without a string \"outcome.pendingToolCallIds[0]\"");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','usage':[{'inputTokens':1.5}]}",
           "\"usage[0].inputTokens\" must be an integer from 0 to 9007199254740991");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','usage':[{'inputTokens':-1}]}",
           "\"usage[0].inputTokens\" must be an integer");
    expect("{'type':'RUN_FINISHED','threadId':'t','runId':'r','usage':[{'inputTokens':"
           "9007199254740992}]}",
           "\"usage[0].inputTokens\" must be an integer");
}

Test(schema, patches_are_json_patch_operations)
{
    expect("{'type':'STATE_DELTA','delta':[{'op':'add','path':'','value':1},{'op':'remove','path':"
           "'/a/~0~1'},{'op':'move','from':'/a','path':'/b'},{'op':'test','path':'/b','value':2}]}",
           NULL);
    expect("{'type':'STATE_DELTA','delta':{}}", "STATE_DELTA \"delta\" must be an array");
    expect("{'type':'STATE_DELTA','delta':[{'op':'add','path':'a','value':1}]}",
           "\"delta[0].path\" must be a JSON Pointer");
    expect("{'type':'STATE_DELTA','delta':[{'op':'add','path':'/a~2','value':1}]}",
           "\"delta[0].path\" must be a JSON Pointer");
    expect("{'type':'STATE_DELTA','delta':[{'op':'add','path':'/a'}]}",
           "\"delta[0].value\" is missing");
    expect("{'type':'STATE_DELTA','delta':[{'op':'copy','path':'/a'}]}",
           "without a string \"delta[0].from\"");
    expect("{'type':'ACTIVITY_DELTA','messageId':'a','activityType':'p','patch':[{'op':'x'}]}",
           NULL);
    expect("{'type':'ACTIVITY_DELTA','messageId':'a','activityType':'p'}",
           "ACTIVITY_DELTA \"patch\" is missing");
    expect("{'type':'ACTIVITY_SNAPSHOT','messageId':'a','activityType':'p','content':{},'replace':"
           "'yes'}",
           "\"replace\" must be true or false");
}

Test(schema, elements_are_counted_past_those_the_client_drops_and_the_message_fits)
{
    char snap[2400], why[48];
    size_t n =
        (size_t)snprintf(snap, sizeof(snap), "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[");
    json_t *v;

    for (int i = 0; i < 150; i++)
        n += (size_t)snprintf(snap + n, sizeof(snap) - n, "{\"role\":\"x\"},");
    snprintf(snap + n, sizeof(snap) - n, "{\"id\":\"u\",\"role\":\"user\",\"content\":7}]}");
    v = json_loads(snap, 0, NULL);
    cr_assert_not_null(v);
    cr_assert(!agw_schema_check(v, why, sizeof(why)));
    /* the index is the element's in the event (the client names it so too), cut to the buffer */
    cr_assert_str_eq(why, "MESSAGES_SNAPSHOT \"messages[150].content\" must ");
    json_decref(v);
}

/* ---- flat events ------------------------------------------------------------------------------
 */

/* The members of flat event <text> (single quotes for double; string, integer and boolean values
 * only) for agw_schema_flat_ok(), and its type; the strings point into <buf>. */
static size_t flat_members(const char *text, char *buf, size_t cap, struct agw_schema_member *m,
                           size_t max, const char **type, size_t *type_len)
{
    json_t *ev = parse(text);
    const char *key;
    json_t *v;
    size_t n = 0, used = 0;

    *type = NULL;
    json_object_foreach(ev, key, v)
    {
        size_t kl = strlen(key);
        cr_assert_lt(n, max);
        cr_assert_lt(used + kl + 1, cap);
        memcpy(buf + used, key, kl + 1);
        m[n] = (struct agw_schema_member){.key = buf + used, .key_len = kl};
        used += kl + 1;
        if (json_is_string(v)) {
            size_t sl = json_string_length(v);
            cr_assert_lt(used + sl + 1, cap);
            memcpy(buf + used, json_string_value(v), sl + 1);
            m[n].kind = AGW_FLAT_STRING;
            m[n].s = buf + used;
            m[n].n = sl;
            used += sl + 1;
            if (strcmp(key, "type") == 0) {
                *type = m[n].s;
                *type_len = sl;
            }
        } else {
            cr_assert(json_is_integer(v) || json_is_boolean(v), "%s is not flat", text);
            m[n].kind = json_is_integer(v) ? AGW_FLAT_INT : AGW_FLAT_BOOL;
        }
        n++;
    }
    json_decref(ev);
    return n;
}

/* The flat check of <text>, its members split as the fast path splits them: the strings of the
 * names agw_schema_span_keys lists in spans, the others ("type" aside) as members. */
static bool flat_ok(const char *text)
{
    char buf[1024];
    struct agw_schema_member m[16], others[16];
    struct agw_schema_span spans[AGW_N_SPANS] = {{0}};
    const char *type;
    size_t type_len, n = flat_members(text, buf, sizeof(buf), m, 16, &type, &type_len),
                     n_others = 0;

    cr_assert_not_null(type);
    for (size_t j = 0; j < n; j++) {
        size_t k = 0;
        if (strcmp(m[j].key, "type") == 0)
            continue;
        while (k < AGW_N_SPANS && strcmp(m[j].key, agw_schema_span_keys[k]) != 0)
            k++;
        if (k < AGW_N_SPANS && m[j].kind == AGW_FLAT_STRING)
            spans[k] = (struct agw_schema_span){.p = m[j].s, .n = m[j].n};
        else
            others[n_others++] = m[j];
    }
    return agw_schema_flat_ok(type, type_len, spans, others, n_others);
}

Test(schema, the_flat_check_takes_the_usual_events)
{
    static const char *const usual[] = {
        "{'type':'RUN_STARTED','threadId':'t','runId':'r','timestamp':1}",
        "{'type':'RUN_FINISHED','threadId':'t','runId':'r'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'m','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'m','subagentRunId':'s'}",
        "{'type':'TOOL_CALL_START','toolCallId':'c','toolCallName':'f','parentMessageId':'m'}",
        "{'type':'TOOL_CALL_END','toolCallId':'c'}",
        "{'type':'TOOL_CALL_RESULT','messageId':'r','toolCallId':'c','content':'x','role':'tool'}",
        "{'type':'STEP_STARTED','stepName':'s','seq':3}",
        "{'type':'REASONING_MESSAGE_START','messageId':'r','role':'reasoning'}",
        "{'type':'CUSTOM','name':'n','value':true}",
        "{'type':'RAW','event':'e','source':'s'}",
        "{'type':'STATE_SNAPSHOT','snapshot':5}",
        "{'type':'SOMETHING_NEW','x':1}",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(usual); i++)
        cr_expect(flat_ok(usual[i]), "%s not taken by the flat check", usual[i]);
}

/* Whatever flat event: the flat check never takes one the full check refuses. The events are made
 * from each type and every subset of a few members, each member in each of its flat kinds. */
Test(schema, the_flat_check_never_takes_what_the_full_check_refuses)
{
    static const char *const types[] = {"TEXT_MESSAGE_START",
                                        "TEXT_MESSAGE_CONTENT",
                                        "TEXT_MESSAGE_END",
                                        "TEXT_MESSAGE_CHUNK",
                                        "TOOL_CALL_START",
                                        "TOOL_CALL_ARGS",
                                        "TOOL_CALL_END",
                                        "TOOL_CALL_CHUNK",
                                        "TOOL_CALL_RESULT",
                                        "STATE_SNAPSHOT",
                                        "STATE_DELTA",
                                        "MESSAGES_SNAPSHOT",
                                        "ACTIVITY_SNAPSHOT",
                                        "ACTIVITY_DELTA",
                                        "RAW",
                                        "CUSTOM",
                                        "RUN_STARTED",
                                        "RUN_FINISHED",
                                        "RUN_ERROR",
                                        "STEP_STARTED",
                                        "STEP_FINISHED",
                                        "REASONING_START",
                                        "REASONING_MESSAGE_START",
                                        "REASONING_MESSAGE_CONTENT",
                                        "REASONING_MESSAGE_END",
                                        "REASONING_MESSAGE_CHUNK",
                                        "REASONING_END",
                                        "REASONING_ENCRYPTED_VALUE",
                                        "SUBAGENT_STARTED",
                                        "SUBAGENT_FINISHED",
                                        "SUBAGENT_ERROR"};
    /* members any of them names, and a few it does not */
    static const char *const keys[] = {
        "messageId", "role",     "delta",    "name",          "toolCallId",      "toolCallName",
        "content",   "snapshot", "event",    "value",         "threadId",        "runId",
        "message",   "code",     "stepName", "subagentRunId", "subtype",         "metadata",
        "replace",   "usage",    "result",   "entityId",      "parentMessageId", "other"};
    /* the values a member takes: strings (one of each enum's values), an integer, a boolean */
    static const char *const values[] = {"'x'",       "'assistant'", "'reasoning'", "'tool'",
                                         "'message'", "1",           "true"};
    size_t checked = 0, taken = 0;

    for (size_t t = 0; t < AGW_ARRAY_LEN(types); t++) {
        /* four members at a time, over a sliding window of the keys */
        for (size_t k0 = 0; k0 < AGW_ARRAY_LEN(keys); k0++) {
            for (unsigned mask = 0; mask < 16; mask++) {
                for (size_t v = 0; v < AGW_ARRAY_LEN(values); v++) {
                    char text[512];
                    size_t n = (size_t)snprintf(text, sizeof(text), "{'type':'%s'", types[t]);
                    for (unsigned b = 0; b < 4; b++) {
                        if (!(mask & (1u << b)))
                            continue;
                        const char *key = keys[(k0 + b * 5) % AGW_ARRAY_LEN(keys)];
                        const char *val = values[(v + b) % AGW_ARRAY_LEN(values)];
                        if (strstr(text, key) != NULL)
                            continue;
                        n += (size_t)snprintf(text + n, sizeof(text) - n, ",'%s':%s", key, val);
                    }
                    snprintf(text + n, sizeof(text) - n, "}");
                    if (flat_ok(text)) {
                        json_t *ev = parse(text);
                        char why[320];
                        cr_assert(agw_schema_check(ev, why, sizeof(why)),
                                  "%s: taken by the flat check, refused by the full one: %s", text,
                                  why);
                        json_decref(ev);
                        taken++;
                    }
                    checked++;
                }
            }
        }
    }
    cr_assert_gt(taken, 100, "%zu of %zu taken", taken, checked);
}

/* What the client holds of a message a snapshot carries whole: the members its schemas name, the
 * content parts and array elements of a kind they know; nothing of a role they do not know. */
Test(schema, a_message_is_stripped_as_the_client_strips_it)
{
    static const struct {
        const char *in, *out; /* out NULL: the client drops the message */
        int rc;
    } cases[] = {
        {"{'id':'u','role':'user','content':'hi'}", "{'id':'u','role':'user','content':'hi'}", 0},
        {"{'id':'u','role':'user','content':'hi','x':1,'y':{}}",
         "{'id':'u','role':'user','content':'hi'}", 1},
        {"{'id':'u','role':'user','content':[{'type':'text','text':'a','x':1},{'type':'gif'},"
         "{'type':'image','source':{'type':'ftp','value':'v'}},'str',"
         "{'type':'image','source':{'type':'url','value':'v','x':2},'y':3}]}",
         "{'id':'u','role':'user','content':[{'type':'text','text':'a'},'str',"
         "{'type':'image','source':{'type':'url','value':'v'}}]}",
         1},
        {"{'id':'a','role':'assistant','toolCalls':[{'id':'c','type':'function','x':1,"
         "'function':{'name':'f','arguments':'{}','y':2}}],'metadata':{'deep':{'z':1}}}",
         "{'id':'a','role':'assistant','toolCalls':[{'id':'c','type':'function',"
         "'function':{'name':'f','arguments':'{}'}}],'metadata':{'deep':{'z':1}}}",
         1},
        {"{'id':'p','role':'activity','activityType':'t','content':{'any':[1]},'q':0}",
         "{'id':'p','role':'activity','activityType':'t','content':{'any':[1]}}", 1},
        {"{'id':'s','role':'system','content':'x','subagentRunId':null}",
         "{'id':'s','role':'system','content':'x','subagentRunId':null}", 0},
        {"{'id':'z','role':'robot','content':'x'}", NULL, -1},
        {"{'id':'z','content':'x'}", NULL, -1},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *m = parse(cases[i].in), *before = json_deep_copy(m);

        cr_assert_eq(agw_schema_strip_message(m, false), cases[i].rc, "case %zu (dry)", i);
        cr_assert(json_equal(m, before), "case %zu: a dry walk changed the message", i);
        cr_assert_eq(agw_schema_strip_message(m, true), cases[i].rc, "case %zu", i);
        if (cases[i].out != NULL) {
            json_t *want = parse(cases[i].out);
            char *got = json_dumps(m, JSON_COMPACT);
            cr_assert(json_equal(m, want), "case %zu: %s", i, got);
            free(got);
            json_decref(want);
            cr_assert_eq(agw_schema_strip_message(m, false), 0, "case %zu: stripped twice", i);
        }
        json_decref(m);
        json_decref(before);
    }
}

struct listing {
    char *text;
    size_t len, cap;
};

static void list_line(void *arg, const char *path, const char *members)
{
    struct listing *l = arg;
    size_t n = strlen(path) + strlen(members) + 3;

    if (l->len + n + 1 > l->cap) {
        l->cap = (l->len + n + 1) * 2;
        l->text = realloc(l->text, l->cap);
        cr_assert_not_null(l->text);
    }
    l->len += (size_t)sprintf(l->text + l->len, "%s: %s\n", path, members);
}

static int cmp_lines(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* The tables name the members the pinned client's schemas name, object by object:
 * tests/interop/client_schemas.txt is the client's schemas walked (tests/interop/client_schemas.mjs
 * checks it against them in upstream_events.sh); here the tables walked must be the same lines. */
Test(schema, the_tables_are_the_clients_schemas)
{
    struct listing l = {NULL, 0, 0};
    const char *src = getenv("AGW_SRCDIR");
    char path[4096], *lines[512], *file, *p;
    size_t n = 0, i;
    FILE *f;
    long size;

    cr_assert_not_null(src, "AGW_SRCDIR is not set (run it through make check)");
    snprintf(path, sizeof(path), "%s/tests/interop/client_schemas.txt", src);
    f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    rewind(f);
    file = calloc(1, (size_t)size + 1);
    cr_assert_eq(fread(file, 1, (size_t)size, f), (size_t)size);
    fclose(f);

    agw_schema_walk(list_line, &l);
    for (p = strtok(l.text, "\n"); p != NULL && n < 512; p = strtok(NULL, "\n"))
        lines[n++] = p;
    qsort(lines, n, sizeof(lines[0]), cmp_lines);
    p = file;
    for (i = 0; i < n; i++) {
        char *nl = strchr(p, '\n');
        cr_assert_not_null(nl, "the tables have more: %s", lines[i]);
        *nl = '\0';
        cr_assert_str_eq(lines[i], p, "the tables say «%s», the client «%s»", lines[i], p);
        p = nl + 1;
    }
    cr_assert_str_eq(p, "", "the client's schemas have more: %s", p);
    cr_assert_gt(n, 100);
    free(l.text);
    free(file);
}
