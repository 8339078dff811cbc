/* Unit tests for src/router.c (doc/protocol.md#routing): exact routes, methods, path-id
 * decoding. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "agw/router.h"

static const enum agw_method all_methods[] = {AGW_METHOD_GET, AGW_METHOD_HEAD, AGW_METHOD_POST,
                                              AGW_METHOD_OPTIONS, AGW_METHOD_OTHER};

Test(router, method_parse)
{
    static const struct {
        const char *s;
        enum agw_method m;
    } cases[] = {
        {"GET", AGW_METHOD_GET},         {"HEAD", AGW_METHOD_HEAD},    {"POST", AGW_METHOD_POST},
        {"OPTIONS", AGW_METHOD_OPTIONS}, {"get", AGW_METHOD_OTHER},    {"Post", AGW_METHOD_OTHER},
        {"PUT", AGW_METHOD_OTHER},       {"DELETE", AGW_METHOD_OTHER}, {"PATCH", AGW_METHOD_OTHER},
        {"CONNECT", AGW_METHOD_OTHER},   {"TRACE", AGW_METHOD_OTHER},  {"GET ", AGW_METHOD_OTHER},
        {"GETX", AGW_METHOD_OTHER},      {"", AGW_METHOD_OTHER},       {NULL, AGW_METHOD_OTHER},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++)
        cr_assert_eq(agw_method_parse(cases[i].s), cases[i].m, "case %zu", i);
}

Test(router, allow_header)
{
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_HEALTHZ), "GET, HEAD");
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_METRICS), "GET, HEAD");
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_RUNS), "POST, OPTIONS");
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_CANCEL), "POST, OPTIONS");
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_THREAD_MESSAGES), "GET, HEAD, OPTIONS");
    cr_assert_str_eq(agw_route_allow(AGW_ROUTE_NONE), "");
}

/* Every route with every method: method_allowed exactly when the method is in the route's Allow
 * list. */
Test(router, routes_and_methods)
{
    static const struct {
        const char *path;
        enum agw_route_id id;
        const char *agent, *run, *thread;
    } cases[] = {
        {"/healthz", AGW_ROUTE_HEALTHZ, "", "", ""},
        {"/metrics", AGW_ROUTE_METRICS, "", "", ""},
        {"/v1/ag-ui/agents/weather/runs", AGW_ROUTE_RUNS, "weather", "", ""},
        {"/v1/ag-ui/agents/weather/runs/run-1/cancel", AGW_ROUTE_CANCEL, "weather", "run-1", ""},
        {"/v1/ag-ui/threads/thread-1/messages", AGW_ROUTE_THREAD_MESSAGES, "", "", "thread-1"},
        {"/v1/ag-kit/agents/legacy/send-message", AGW_ROUTE_AGKIT_SEND, "legacy", "", ""},
        {"/v1/ag-kit/agents/a%2Eb/send-message", AGW_ROUTE_AGKIT_SEND, "a.b", "", ""},
    };
    static const char *const method_names[] = {"GET", "HEAD", "POST", "OPTIONS", "OTHER"};

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        const char *allow = agw_route_allow(cases[i].id);
        for (size_t m = 0; m < AGW_ARRAY_LEN(all_methods); m++) {
            struct agw_route r;
            int rc = agw_router_match(cases[i].path, all_methods[m], &r);
            bool want =
                all_methods[m] != AGW_METHOD_OTHER && strstr(allow, method_names[m]) != NULL;

            cr_assert_eq(rc, 0, "%s %s: %d", method_names[m], cases[i].path, rc);
            cr_assert_eq(r.id, cases[i].id, "%s", cases[i].path);
            cr_assert_eq(r.method_allowed, want, "%s %s", method_names[m], cases[i].path);
            cr_assert_str_eq(r.agent_id, cases[i].agent);
            cr_assert_str_eq(r.run_id, cases[i].run);
            cr_assert_str_eq(r.thread_id, cases[i].thread);
        }
    }
}

Test(router, method_table)
{
    static const struct {
        const char *path;
        enum agw_method m;
        bool allowed;
    } cases[] = {
        {"/healthz", AGW_METHOD_GET, true},
        {"/healthz", AGW_METHOD_HEAD, true},
        {"/healthz", AGW_METHOD_POST, false},
        {"/healthz", AGW_METHOD_OPTIONS, false},
        {"/metrics", AGW_METHOD_GET, true},
        {"/metrics", AGW_METHOD_POST, false},
        {"/v1/ag-ui/agents/a/runs", AGW_METHOD_POST, true},
        {"/v1/ag-ui/agents/a/runs", AGW_METHOD_OPTIONS, true},
        {"/v1/ag-ui/agents/a/runs", AGW_METHOD_GET, false},
        {"/v1/ag-ui/agents/a/runs", AGW_METHOD_HEAD, false},
        {"/v1/ag-ui/agents/a/runs", AGW_METHOD_OTHER, false},
        {"/v1/ag-ui/agents/a/runs/r/cancel", AGW_METHOD_POST, true},
        {"/v1/ag-ui/agents/a/runs/r/cancel", AGW_METHOD_OPTIONS, true},
        {"/v1/ag-ui/agents/a/runs/r/cancel", AGW_METHOD_GET, false},
        {"/v1/ag-ui/threads/t/messages", AGW_METHOD_GET, true},
        {"/v1/ag-ui/threads/t/messages", AGW_METHOD_HEAD, true},
        {"/v1/ag-ui/threads/t/messages", AGW_METHOD_OPTIONS, true},
        {"/v1/ag-ui/threads/t/messages", AGW_METHOD_POST, false},
        {"/v1/ag-ui/threads/t/messages", AGW_METHOD_OTHER, false},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_route r;
        cr_assert_eq(agw_router_match(cases[i].path, cases[i].m, &r), 0, "case %zu", i);
        cr_assert_eq(r.method_allowed, cases[i].allowed, "case %zu", i);
    }
}

Test(router, not_found)
{
    static const char *const paths[] = {
        "",
        "/",
        "healthz",
        "/healthzx",
        "/healthz/",
        "//healthz",
        "/healthz?x=1", /* the caller strips the query; left in, it is not the same path */
        "/HEALTHZ",
        "/metrics/",
        "/metricsx",
        "/v1",
        "/v1/",
        "/v1/ag-ui",
        "/v1/ag-ui/agents",
        "/v1/ag-ui/agents/",
        "/v1/ag-ui/agents/a",
        "/v1/ag-ui/agents/a/",
        "/v1/ag-ui/agents/a/run",
        "/v1/ag-ui/agents/a/runsx",
        "/v1/ag-ui/agents/a/runs/",
        "/v1/ag-ui/agents/a/runs/r",
        "/v1/ag-ui/agents/a/runs/r/",
        "/v1/ag-ui/agents/a/runs/r/cancel/",
        "/v1/ag-ui/agents/a/runs/r/cancelx",
        "/v1/ag-ui/agents/a/runs/r/x/cancel",
        "/v1/ag-ui/agents/a/b/runs",
        "/v1/ag-ui/agents/%zz/nope", /* an id is only decoded once the path has a route's shape */
        "/v1/ag-ui/threads",
        "/v1/ag-ui/threads/",
        "/v1/ag-ui/threads/t",
        "/v1/ag-ui/threads/t/",
        "/v1/ag-ui/threads/t/messages/",
        "/v1/ag-ui/threads/t/messagesx",
        "/v1/ag-ui/threads/t/u/messages",
        "/v1/ag-ui/agent/a/runs",
        "/v2/ag-ui/agents/a/runs",
        "/V1/ag-ui/agents/a/runs",
        "/v1/ag-ui/agents/a/runs#x",
        "/v1//ag-ui/agents/a/runs",
        "/x/v1/ag-ui/agents/a/runs",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(paths); i++) {
        struct agw_route r;
        memset(&r, 0x5a, sizeof(r));
        cr_assert_eq(agw_router_match(paths[i], AGW_METHOD_GET, &r), -AGW_ENOTFOUND, "'%s'",
                     paths[i]);
        cr_assert_eq(r.id, AGW_ROUTE_NONE, "'%s'", paths[i]);
        cr_assert_not(r.method_allowed);
    }
    struct agw_route r;
    cr_assert_eq(agw_router_match(NULL, AGW_METHOD_GET, &r), -AGW_ENOTFOUND);
}

Test(router, invalid_ids)
{
    static const char *const paths[] = {
        "/v1/ag-ui/agents//runs",                  /* empty agent */
        "/v1/ag-ui/agents/a/runs//cancel",         /* empty run */
        "/v1/ag-ui/threads//messages",             /* empty thread */
        "/v1/ag-ui/agents/%zz/runs",               /* bad escape */
        "/v1/ag-ui/agents/a%2/runs",               /* truncated escape */
        "/v1/ag-ui/agents/a%/runs",                /* truncated escape */
        "/v1/ag-ui/agents/a/runs/r%/cancel",       /* truncated escape */
        "/v1/ag-ui/threads/%g0/messages",          /* bad escape */
        "/v1/ag-ui/agents/a%2Fb/runs",             /* encoded '/' */
        "/v1/ag-ui/agents/a/runs/r%2fx/cancel",    /* encoded '/', lowercase */
        "/v1/ag-ui/threads/t%2Fu/messages",        /* encoded '/' */
        "/v1/ag-ui/threads/t%00/messages",         /* NUL */
        "/v1/ag-ui/threads/t%0Au/messages",        /* LF */
        "/v1/ag-ui/threads/t%0du/messages",        /* CR */
        "/v1/ag-ui/threads/t%1F/messages",         /* control */
        "/v1/ag-ui/threads/t%7F/messages",         /* DEL */
        "/v1/ag-ui/threads/t\x01/messages",        /* raw control */
        "/v1/ag-ui/threads/%FF/messages",          /* invalid UTF-8 */
        "/v1/ag-ui/threads/%C3/messages",          /* truncated UTF-8 */
        "/v1/ag-ui/threads/%C0%AF/messages",       /* overlong '/' */
        "/v1/ag-ui/threads/%ED%A0%80/messages",    /* surrogate */
        "/v1/ag-ui/threads/%F4%90%80%80/messages", /* above U+10FFFF */
        "/v1/ag-ui/threads/\xe9t\xe9/messages",    /* raw Latin-1 */
        "/v1/ag-ui/threads/./messages",            /* dot segments */
        "/v1/ag-ui/threads/../messages",           /* dot segments */
        "/v1/ag-ui/threads/%2E%2E/messages",       /* encoded dot segment */
        "/v1/ag-ui/agents/../runs",                /* dot segment as agent */
        "/v1/ag-ui/agents/a%20b/runs",             /* decodes fine, but not an agent id */
        "/v1/ag-ui/agents/a+b/runs",               /* '+' is literal, and not an agent char */
        "/v1/ag-ui/agents/caf%C3%A9/runs",         /* UTF-8, but not an agent id */
        "/v1/ag-ui/agents/%41%zz/runs/r/cancel",   /* bad escape after a good one */
        "/v1/ag-ui/agents/a:b/runs",               /* not an agent char */
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(paths); i++) {
        struct agw_route r;
        cr_assert_eq(agw_router_match(paths[i], AGW_METHOD_POST, &r), -AGW_EINVAL, "'%s'",
                     paths[i]);
        cr_assert_eq(r.id, AGW_ROUTE_NONE, "'%s'", paths[i]);
        cr_assert_str_eq(r.agent_id, "");
        cr_assert_str_eq(r.run_id, "");
        cr_assert_str_eq(r.thread_id, "");
    }
}

Test(router, invalid_id_wins_over_method)
{
    struct agw_route r;
    cr_assert_eq(agw_router_match("/v1/ag-ui/agents/%zz/runs", AGW_METHOD_GET, &r), -AGW_EINVAL);
}

Test(router, decoding)
{
    static const struct {
        const char *path;
        enum agw_route_id id;
        const char *agent, *run, *thread;
    } cases[] = {
        {"/v1/ag-ui/agents/%41gent/runs", AGW_ROUTE_RUNS, "Agent", "", ""},
        {"/v1/ag-ui/agents/a%2db/runs", AGW_ROUTE_RUNS, "a-b", "", ""},
        {"/v1/ag-ui/agents/a%2Db/runs", AGW_ROUTE_RUNS, "a-b", "", ""},
        {"/v1/ag-ui/agents/A.b_c-9/runs", AGW_ROUTE_RUNS, "A.b_c-9", "", ""},
        {"/v1/ag-ui/agents/a/runs/r+1/cancel", AGW_ROUTE_CANCEL, "a", "r+1", ""},
        {"/v1/ag-ui/agents/a/runs/r%20%201/cancel", AGW_ROUTE_CANCEL, "a", "r  1", ""},
        {"/v1/ag-ui/agents/a/runs/%3Fq%3D1%23/cancel", AGW_ROUTE_CANCEL, "a", "?q=1#", ""},
        {"/v1/ag-ui/threads/caf%C3%A9/messages", AGW_ROUTE_THREAD_MESSAGES, "", "", "caf\xc3\xa9"},
        {"/v1/ag-ui/threads/caf%c3%a9/messages", AGW_ROUTE_THREAD_MESSAGES, "", "", "caf\xc3\xa9"},
        {"/v1/ag-ui/threads/\xe4\xb8\xad/messages", AGW_ROUTE_THREAD_MESSAGES, "", "",
         "\xe4\xb8\xad"},
        {"/v1/ag-ui/threads/%F0%9F%98%80/messages", AGW_ROUTE_THREAD_MESSAGES, "", "",
         "\xf0\x9f\x98\x80"},
        {"/v1/ag-ui/threads/%25/messages", AGW_ROUTE_THREAD_MESSAGES, "", "", "%"},
        {"/v1/ag-ui/threads/.../messages", AGW_ROUTE_THREAD_MESSAGES, "", "", "..."},
        {"/v1/ag-ui/threads/.x/messages", AGW_ROUTE_THREAD_MESSAGES, "", "", ".x"},
        {"/v1/ag-ui/threads/5b0c3c1e-1d2f-4f6a-9b1e-2c3d4e5f6a7b/messages",
         AGW_ROUTE_THREAD_MESSAGES, "", "", "5b0c3c1e-1d2f-4f6a-9b1e-2c3d4e5f6a7b"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_route r;
        cr_assert_eq(agw_router_match(cases[i].path, AGW_METHOD_POST, &r), 0, "'%s'",
                     cases[i].path);
        cr_assert_eq(r.id, cases[i].id, "'%s'", cases[i].path);
        cr_assert_str_eq(r.agent_id, cases[i].agent, "'%s'", cases[i].path);
        cr_assert_str_eq(r.run_id, cases[i].run, "'%s'", cases[i].path);
        cr_assert_str_eq(r.thread_id, cases[i].thread, "'%s'", cases[i].path);
    }
}

Test(router, id_length_limits)
{
    char path[4 * AGW_ID_MAX + 64];
    char id[3 * AGW_ID_MAX + 4];
    struct agw_route r;

    /* AGW_ID_MAX decoded bytes: accepted; one more: refused. */
    memset(id, 't', AGW_ID_MAX);
    id[AGW_ID_MAX] = '\0';
    snprintf(path, sizeof(path), "/v1/ag-ui/threads/%s/messages", id);
    cr_assert_eq(agw_router_match(path, AGW_METHOD_GET, &r), 0);
    cr_assert_eq(strlen(r.thread_id), AGW_ID_MAX);
    id[AGW_ID_MAX] = 't';
    id[AGW_ID_MAX + 1] = '\0';
    snprintf(path, sizeof(path), "/v1/ag-ui/threads/%s/messages", id);
    cr_assert_eq(agw_router_match(path, AGW_METHOD_GET, &r), -AGW_EINVAL);

    /* The limit is on decoded bytes: AGW_ID_MAX escapes are fine. */
    for (size_t i = 0; i < AGW_ID_MAX; i++)
        memcpy(id + 3 * i, "%41", 3);
    id[3 * AGW_ID_MAX] = '\0';
    snprintf(path, sizeof(path), "/v1/ag-ui/agents/a/runs/%s/cancel", id);
    cr_assert_eq(agw_router_match(path, AGW_METHOD_POST, &r), 0);
    cr_assert_eq(strlen(r.run_id), AGW_ID_MAX);
    cr_assert_eq(r.run_id[0], 'A');

    /* Agent ids: 64 characters at most. */
    memset(id, 'a', 64);
    id[64] = '\0';
    snprintf(path, sizeof(path), "/v1/ag-ui/agents/%s/runs", id);
    cr_assert_eq(agw_router_match(path, AGW_METHOD_POST, &r), 0);
    cr_assert_str_eq(r.agent_id, id);
    id[64] = 'a';
    id[65] = '\0';
    snprintf(path, sizeof(path), "/v1/ag-ui/agents/%s/runs", id);
    cr_assert_eq(agw_router_match(path, AGW_METHOD_POST, &r), -AGW_EINVAL);
}

Test(router, path_id_decode)
{
    char out[AGW_ID_MAX + 1];
    char small[4];

    cr_assert_eq(agw_path_id_decode("abc", 3, out, sizeof(out)), 3);
    cr_assert_str_eq(out, "abc");
    cr_assert_eq(agw_path_id_decode("a%41%61", 7, out, sizeof(out)), 3);
    cr_assert_str_eq(out, "aAa");
    /* only <len> bytes are read */
    cr_assert_eq(agw_path_id_decode("ab/cd", 2, out, sizeof(out)), 2);
    cr_assert_str_eq(out, "ab");
    cr_assert_eq(agw_path_id_decode("a%4", 1, out, sizeof(out)), 1);
    cr_assert_eq(agw_path_id_decode("a%4", 3, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("", 0, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("a/b", 3, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("%2F", 3, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("%zz", 3, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("%00", 3, out, sizeof(out)), -AGW_EINVAL);
    cr_assert_eq(agw_path_id_decode("a+b", 3, out, sizeof(out)), 3);
    cr_assert_str_eq(out, "a+b");
    /* <outlen> bounds the output: 3 bytes + NUL fit in 4, 4 do not */
    cr_assert_eq(agw_path_id_decode("abc", 3, small, sizeof(small)), 3);
    cr_assert_eq(agw_path_id_decode("abcd", 4, small, sizeof(small)), -AGW_EINVAL);
    cr_assert_str_eq(small, "");
}

Test(router, agent_id_valid)
{
    static const struct {
        const char *id;
        bool ok;
    } cases[] = {
        {"a", true},
        {"weather", true},
        {"Weather-Agent_2.0", true},
        {"0", true},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true},   /* 64 */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false}, /* 65 */
        {"", false},
        {NULL, false},
        {"a b", false},
        {"a/b", false},
        {"a:b", false},
        {"a%41", false},
        {"caf\xc3\xa9", false},
        {"a\n", false},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++)
        cr_assert_eq(agw_agent_id_valid(cases[i].id), cases[i].ok, "case %zu", i);
}

Test(router, agkit_route_shapes)
{
    static const char *const unknown[] = {"/v1/ag-kit/agents/legacy",
                                          "/v1/ag-kit/agents/legacy/",
                                          "/v1/ag-kit/agents/legacy/send-message/",
                                          "/v1/ag-kit/agents/legacy/runs",
                                          "/v1/ag-kit/agents/%zz/nope",
                                          "/v1/ag-kit/legacy/send-message"};
    struct agw_route r;

    for (size_t i = 0; i < AGW_ARRAY_LEN(unknown); i++)
        cr_assert_eq(agw_router_match(unknown[i], AGW_METHOD_POST, &r), -AGW_ENOTFOUND, "%s",
                     unknown[i]);
    cr_assert_eq(agw_router_match("/v1/ag-kit/agents/bad%20id/send-message", AGW_METHOD_POST, &r),
                 -AGW_EINVAL, "an agent id outside [A-Za-z0-9._-]");
    cr_assert_eq(agw_router_match("/v1/ag-kit/agents/%zz/send-message", AGW_METHOD_POST, &r),
                 -AGW_EINVAL);
    cr_assert_eq(agw_router_match("/v1/ag-kit/agents//send-message", AGW_METHOD_POST, &r),
                 -AGW_EINVAL, "an empty id, as for /v1/ag-ui/agents//runs");
}
