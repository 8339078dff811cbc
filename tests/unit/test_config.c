/* Unit tests for src/config.c: every valid form, the defaults, and every error message (key path +
 * reason). */
#include "config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agw/config.h"
#include "agw/log.h"

#define BASE  "\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],\"auth\":{\"mode\":\"none\"}"
#define AGENT "\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9001/agent\"]}}"

static struct agw_config *load(const char *json, char *err)
{
    return agw_config_load_string(json, err, AGW_CONFIG_ERR_MAX);
}

/* Loading must fail with an error that starts with <prefix>. */
static void expect_error(const char *json, const char *prefix)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    struct agw_config *cfg = load(json, err);

    cr_assert_null(cfg, "expected an error for %s", json);
    cr_assert(strncmp(err, prefix, strlen(prefix)) == 0, "error '%s' does not start with '%s'", err,
              prefix);
}

Test(config, minimal_and_defaults)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    struct agw_config *cfg = load("{" BASE "," AGENT "}", err);

    cr_assert_not_null(cfg, "%s", err);
    cr_assert_eq(cfg->n_listeners, 1);
    cr_assert_str_eq(cfg->listeners[0].address, "127.0.0.1");
    cr_assert_eq(cfg->listeners[0].port, 0);
    cr_assert_null(cfg->admin);
    cr_assert_eq(cfg->auth.mode, AGW_AUTH_NONE);
    cr_assert_eq(cfg->limits.max_body_bytes, 1024 * 1024);
    cr_assert_eq(cfg->limits.stream_buffer_bytes, 256 * 1024);
    cr_assert_eq(cfg->limits.max_frame_bytes, 1024 * 1024);
    cr_assert_eq(cfg->limits.max_json_depth, 64);
    cr_assert_eq(cfg->limits.upstream_idle_connections, 256);
    cr_assert_eq(cfg->timeouts.connect_ms, 5000);
    cr_assert_eq(cfg->timeouts.first_byte_ms, 60000);
    cr_assert_eq(cfg->timeouts.idle_ms, 300000);
    cr_assert_eq(cfg->timeouts.run_ms, 0);
    cr_assert_eq(cfg->timeouts.heartbeat_ms, 15000);
    cr_assert_eq(cfg->timeouts.drain_ms, 30000);
    cr_assert_eq(cfg->batch_window_us, 100, "wake-up batching is on by default");
    cr_assert_eq(cfg->store.kind, AGW_STORE_EMBEDDED);
    cr_assert_str_eq(cfg->store.path, "var/agui-gateway");
    cr_assert(cfg->history.enabled);
    cr_assert_eq(cfg->history.max_messages_per_thread, 1000);
    cr_assert_eq(cfg->history.ttl_s, 0);
    cr_assert_eq(cfg->history.cache_threads, 10000);
    cr_assert_eq(cfg->decisions.match, AGW_MATCH_RUN);
    cr_assert_eq(cfg->decisions.no_active_run, AGW_NO_ACTIVE_RUN_NEW_RUN);
    cr_assert_eq(cfg->log.level, AGW_LOG_INFO);
    cr_assert_str_eq(cfg->log.access, "stderr");
    const struct agw_agent_config *a = agw_config_find_agent(cfg, "a");
    cr_assert_not_null(a);
    cr_assert_eq(a->protocol, AGW_PROTO_AGUI);
    cr_assert_eq(a->balance, AGW_BALANCE_THREAD_AFFINITY);
    cr_assert_eq(a->retries, 1);
    cr_assert_eq(a->max_fails, 1);
    cr_assert_eq(a->fail_timeout_ms, 10000);
    cr_assert_eq(a->on_client_disconnect, AGW_DISCONNECT_CANCEL);
    cr_assert_eq(a->n_upstreams, 1);
    cr_assert_str_eq(a->upstreams[0].host, "127.0.0.1");
    cr_assert_eq(a->upstreams[0].port, 9001);
    cr_assert_str_eq(a->upstreams[0].target, "/agent");
    cr_assert_str_eq(a->upstreams[0].authority, "127.0.0.1:9001");
    cr_assert_null(agw_config_find_agent(cfg, "b"));
    agw_config_free(cfg);
    agw_config_free(NULL);
}

Test(config, full)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    setenv("AGW_TEST_SECRET", "backend-secret", 1);
    struct agw_config *cfg =
        load("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":8080},"
             "{\"address\":\"::1\",\"port\":8443,\"tls\":{\"cert\":\"c.pem\",\"key\":\"k.pem\"}}],"
             "\"admin\":{\"address\":\"127.0.0.1\",\"port\":9090},"
             "\"auth\":{\"keys\":[{\"id\":\"web\",\"sha256\":"
             "\"2A97516C354B68848CDBD8F54A226A0A55B21ED138E207AD6C5CBB9C00AA5AEA\",\"agents\":["
             "\"z\",\"a\"]},"
             "{\"id\":\"ops\",\"sha256\":"
             "\"2a97516c354b68848cdbd8f54a226a0a55b21ed138e207ad6c5cbb9c00aa5aea\","
             "\"agents\":[\"*\"]}]},"
             "\"agents\":{\"z\":{\"upstreams\":\"https://backend.example:8443/"
             "run?x=1\",\"protocol\":\"ag-kit\","
             "\"balance\":\"round_robin\",\"retries\":3,\"on_client_disconnect\":\"detach\","
             "\"max_fails\":0,\"fail_timeout\":\"1m\","
             "\"upstream_headers\":{\"X-Api-Key\":\"k1\",\"X-Auth\":\"Bearer ${AGW_TEST_SECRET}\"},"
             "\"forward_headers\":[\"X-Tenant\"]},"
             "\"a\":{\"upstreams\":[\"http://[::1]:9001/a\",\"http://h2\"]}},"
             "\"limits\":{\"max_body_bytes\":\"2MiB\",\"stream_buffer_bytes\":65536,\"max_frame_"
             "bytes\":\"512k\","
             "\"max_header_bytes\":\"32KiB\",\"max_json_depth\":20,"
             "\"upstream_idle_connections\":0},"
             "\"timeouts\":{\"connect\":\"500ms\",\"first_byte\":\"2m\",\"idle\":0,\"run\":\"1h\","
             "\"heartbeat\":\"15s\","
             "\"drain\":1000,\"request\":\"10s\"},"
             "\"store\":{\"kind\":\"redis\",\"url\":\"redis://127.0.0.1:6379/0\"},"
             "\"decisions\":{\"match\":\"thread\",\"no_active_run\":\"reject\"},"
             "\"log\":{\"level\":\"debug\",\"access\":\"off\"},\"workers\":2,"
             "\"batch_window_us\":250}",
             err);

    cr_assert_not_null(cfg, "%s", err);
    cr_assert_eq(cfg->n_listeners, 2);
    cr_assert_str_eq(cfg->listeners[1].address, "::1");
    cr_assert_str_eq(cfg->listeners[1].tls.cert, "c.pem");
    cr_assert_eq(cfg->admin->port, 9090);
    cr_assert_eq(cfg->n_agents, 2);
    cr_assert_str_eq(cfg->agents[0].id, "a", "agents are sorted by id");
    const struct agw_agent_config *z = agw_config_find_agent(cfg, "z");
    cr_assert(z->upstreams[0].tls);
    cr_assert_eq(z->upstreams[0].port, 8443);
    cr_assert_str_eq(z->upstreams[0].target, "/run?x=1");
    cr_assert_eq(z->protocol, AGW_PROTO_AGKIT);
    cr_assert_eq(z->balance, AGW_BALANCE_ROUND_ROBIN);
    cr_assert_eq(z->retries, 3);
    cr_assert_eq(z->max_fails, 0);
    cr_assert_eq(z->fail_timeout_ms, 60000);
    cr_assert_eq(z->on_client_disconnect, AGW_DISCONNECT_DETACH);
    cr_assert_eq(z->n_upstream_headers, 2);
    cr_assert_str_eq(z->upstream_headers[1].value, "Bearer backend-secret", "${ENV} expanded");
    cr_assert_str_eq(z->forward_headers[0], "X-Tenant");
    const struct agw_agent_config *a = agw_config_find_agent(cfg, "a");
    cr_assert_str_eq(a->upstreams[0].host, "::1");
    cr_assert_str_eq(a->upstreams[0].authority, "[::1]:9001");
    cr_assert_eq(a->upstreams[1].port, 80);
    cr_assert_str_eq(a->upstreams[1].target, "/");
    cr_assert_eq(cfg->auth.n_keys, 2);
    cr_assert_eq(cfg->auth.keys[0].sha256[0], 0x2a);
    cr_assert_eq(cfg->auth.keys[0].n_agents, 2);
    cr_assert(cfg->auth.keys[1].all_agents);
    cr_assert_eq(cfg->limits.max_body_bytes, 2 * 1024 * 1024);
    cr_assert_eq(cfg->limits.stream_buffer_bytes, 65536);
    cr_assert_eq(cfg->limits.max_frame_bytes, 512 * 1024);
    cr_assert_eq(cfg->limits.max_json_depth, 20);
    cr_assert_eq(cfg->limits.upstream_idle_connections, 0);
    cr_assert_eq(cfg->timeouts.connect_ms, 500);
    cr_assert_eq(cfg->timeouts.first_byte_ms, 120000);
    cr_assert_eq(cfg->timeouts.idle_ms, 0);
    cr_assert_eq(cfg->timeouts.run_ms, 3600000);
    cr_assert_eq(cfg->timeouts.drain_ms, 1000);
    cr_assert_eq(cfg->store.kind, AGW_STORE_REDIS);
    cr_assert_eq(cfg->decisions.match, AGW_MATCH_THREAD);
    cr_assert_eq(cfg->log.level, AGW_LOG_DEBUG);
    cr_assert_eq(cfg->workers, 2);
    cr_assert_eq(cfg->batch_window_us, 250);
    agw_config_free(cfg);
}

Test(config, durations_and_sizes)
{
    uint32_t ms;
    size_t n;

    cr_assert_eq(agw_parse_duration("5s", &ms), 0);
    cr_assert_eq(ms, 5000);
    cr_assert_eq(agw_parse_duration("500ms", &ms), 0);
    cr_assert_eq(ms, 500);
    cr_assert_eq(agw_parse_duration("2m", &ms), 0);
    cr_assert_eq(ms, 120000);
    cr_assert_eq(agw_parse_duration("1h", &ms), 0);
    cr_assert_eq(ms, 3600000);
    cr_assert_eq(agw_parse_duration("250", &ms), 0);
    cr_assert_eq(ms, 250);
    cr_assert_eq(agw_parse_duration("", &ms), -AGW_EINVAL);
    cr_assert_eq(agw_parse_duration("-1s", &ms), -AGW_EINVAL);
    cr_assert_eq(agw_parse_duration("5 s", &ms), -AGW_EINVAL);
    cr_assert_eq(agw_parse_duration("5d", &ms), -AGW_EINVAL);
    cr_assert_eq(agw_parse_duration("99999999999", &ms), -AGW_EINVAL);
    cr_assert_eq(agw_parse_duration("5000h", &ms), -AGW_EINVAL, "over 2^32 ms");
    cr_assert_eq(agw_parse_size("1MiB", &n), 0);
    cr_assert_eq(n, 1048576);
    cr_assert_eq(agw_parse_size("256KiB", &n), 0);
    cr_assert_eq(n, 262144);
    cr_assert_eq(agw_parse_size("512k", &n), 0);
    cr_assert_eq(n, 524288);
    cr_assert_eq(agw_parse_size("1g", &n), 0);
    cr_assert_eq(agw_parse_size("100", &n), 0);
    cr_assert_eq(n, 100);
    cr_assert_eq(agw_parse_size("1.5MiB", &n), -AGW_EINVAL);
    cr_assert_eq(agw_parse_size("MiB", &n), -AGW_EINVAL);
    cr_assert_eq(agw_parse_size("10parsecs", &n), -AGW_EINVAL);
}

Test(config, urls)
{
    struct agw_url u;
    char err[128];

    cr_assert_eq(agw_url_parse("http://localhost:9001/agent?a=1", &u, err, sizeof(err)), 0);
    cr_assert_str_eq(u.host, "localhost");
    cr_assert_eq(u.port, 9001);
    cr_assert_str_eq(u.target, "/agent?a=1");
    cr_assert_not(u.tls);
    agw_url_clear(&u);
    cr_assert_eq(agw_url_parse("https://api.example.com", &u, err, sizeof(err)), 0);
    cr_assert_eq(u.port, 443);
    cr_assert_str_eq(u.target, "/");
    cr_assert_str_eq(u.authority, "api.example.com");
    agw_url_clear(&u);
    cr_assert_eq(agw_url_parse("http://h?x=1", &u, err, sizeof(err)), 0);
    cr_assert_str_eq(u.target, "/?x=1");
    agw_url_clear(&u);
    static const char *const bad[] = {
        "foo",           "ftp://h/",       "http://",         "http:///x",
        "http://u:p@h/", "http://h:0/",    "http://h:65536/", "http://h:x/",
        "http://h/a b",  "http://h/#frag", "http://[zz]/",    "http://h!/"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(agw_url_parse(bad[i], &u, err, sizeof(err)), -AGW_EINVAL, "%s", bad[i]);
}

Test(config, errors_name_the_key_path)
{
    expect_error("{" BASE "," AGENT ",\"bogus\":1}", "bogus: unknown key");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],\"colour\":1}}}",
                 "agents.a.colour: unknown key");
    expect_error("{" BASE ",\"agents\":{\"weather\":{\"upstreams\":[\"foo\"]}}}",
                 "agents.weather.upstreams[0]: expects an http(s) URL, got 'foo'");
    expect_error("{" BASE "," AGENT ",\"timeouts\":{\"connect\":\"abc\"}}",
                 "timeouts.connect: expects a duration like \"5s\" or \"500ms\", got 'abc'");
    expect_error("{" BASE "," AGENT ",\"timeouts\":{\"connect\":0}}",
                 "timeouts.connect: must be greater than 0");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],\"max_fails\":-1}}}",
                 "agents.a.max_fails: expects an integer 0..1000");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],\"fail_timeout\":"
                 "\"soon\"}}}",
                 "agents.a.fail_timeout: expects a duration like \"5s\" or \"500ms\", got 'soon'");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],\"fail_timeout\":"
                 "\"2h\"}}}",
                 "agents.a.fail_timeout: must be from 1ms to 1h");
    expect_error("{" BASE "," AGENT ",\"limits\":{\"max_body_bytes\":\"lots\"}}",
                 "limits.max_body_bytes: expects a size");
    expect_error("{" BASE "," AGENT ",\"limits\":{\"upstream_idle_connections\":-1}}",
                 "limits.upstream_idle_connections: expects an integer 0..100000");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":70000}],\"auth\":{\"mode\":"
                 "\"none\"}," AGENT "}",
                 "listen[0].port: expects an integer 0..65535");
    expect_error(
        "{\"listen\":[{\"address\":\"localhost\",\"port\":1}],\"auth\":{\"mode\":\"none\"}," AGENT
        "}",
        "listen[0].address: expects a numeric IPv4 or IPv6 address");
    expect_error("{\"listen\":[]," AGENT ",\"auth\":{\"mode\":\"none\"}}", "listen: required");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT "}",
                 "auth: required");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT
                 ",\"auth\":{\"mode\":\"none\",\"keys\":[]}}",
                 "auth.keys: not allowed");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT
                 ",\"auth\":{\"keys\":[]}}",
                 "auth.keys: expects a non-empty array");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT
                 ",\"auth\":{\"keys\":[{\"id\":\"k\",\"sha256\":\"1234\",\"agents\":[\"a\"]}]}}",
                 "auth.keys[0].sha256: expects 64 hex characters");
    expect_error("{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT
                 ",\"auth\":{\"keys\":[{\"id\":\"k\",\"sha256\":"
                 "\"2a97516c354b68848cdbd8f54a226a0a55b21ed138e207ad6c5cbb9c00aa5aea\",\"agents\":["
                 "\"nope\"]}]}}",
                 "auth.keys[0].agents[0]: no agent 'nope' in agents");
    expect_error("{" BASE ",\"agents\":{\"bad id\":{\"upstreams\":[\"http://h/\"]}}}",
                 "agents.bad id: an agent id");
    expect_error("{" BASE ",\"agents\":{}}", "agents: required");
    expect_error("{" BASE
                 ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],\"protocol\":\"grpc\"}}}",
                 "agents.a.protocol: expects one of \"ag-ui\", \"ag-kit\", got 'grpc'");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/"
                 "\"],\"upstream_headers\":{\"Bad Name\":\"x\"}}}}",
                 "agents.a.upstream_headers.Bad Name: not a valid header name");
    expect_error("{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/"
                 "\"],\"forward_headers\":[\"Authorization\"]}}}",
                 "agents.a.forward_headers[0]: 'Authorization' is never forwarded");
    expect_error(
        "{" BASE ",\"agents\":{\"a\":{\"upstreams\":[\"http://h/\"],"
        "\"upstream_headers\":{\"X-K\":\"${AGW_TEST_UNSET_VARIABLE}\"}}}}",
        "agents.a.upstream_headers.X-K: environment variable AGW_TEST_UNSET_VARIABLE is not set");
    expect_error("{" BASE "," AGENT ",\"store\":{\"kind\":\"redis\"}}", "store.url: required");
    expect_error("{" BASE "," AGENT ",\"history\":{\"ttl\":\"30 days\"}}",
                 "history.ttl: expects \"0\" (keep) or a period like \"30d\"");
    expect_error("{" BASE "," AGENT ",\"history\":{\"ttl\":30}}", "history.ttl: expects");
    expect_error("{" BASE "," AGENT ",\"history\":{\"enabled\":\"yes\"}}",
                 "history.enabled: expects true or false");
    expect_error("{" BASE "," AGENT ",\"history\":{\"max_messages_per_thread\":0}}",
                 "history.max_messages_per_thread: expects an integer 1..1000000");
    expect_error("{" BASE "," AGENT ",\"history\":{\"keep\":1}}", "history.keep: unknown key");
    expect_error("{" BASE "," AGENT ",\"log\":{\"level\":\"loud\"}}", "log.level: expects one of");
    expect_error("{" BASE "," AGENT ",\"workers\":-1}", "workers: expects an integer 0..64");
    expect_error("{" BASE "," AGENT ",\"batch_window_us\":10001}",
                 "batch_window_us: expects an integer 0..10000");
    expect_error("{" BASE "," AGENT ",\"batch_window_us\":\"100us\"}",
                 "batch_window_us: expects an integer 0..10000");
    expect_error("{\"listen\": [", "invalid JSON at line 1");
    expect_error("{" BASE "," AGENT ",\"workers\":1,\"workers\":2}", "invalid JSON");
}

Test(config, key_digest_is_never_echoed)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    struct agw_config *cfg = load(
        "{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":1}]," AGENT
        ",\"auth\":{\"keys\":[{\"id\":\"k\",\"sha256\":\"my-secret-token\",\"agents\":[\"a\"]}]}}",
        err);
    cr_assert_null(cfg);
    cr_assert_null(strstr(err, "my-secret-token"), "%s", err);
}

Test(config, files)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    char path[] = "/tmp/agw-config-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");

    fputs("{" BASE ",\n" AGENT "\n}\n", f);
    fclose(f);
    struct agw_config *cfg = agw_config_load_file(path, err, sizeof(err));
    cr_assert_not_null(cfg, "%s", err);
    agw_config_free(cfg);
    f = fopen(path, "w");
    fputs("{\n  \"listen\": [,\n}\n", f);
    fclose(f);
    cr_assert_null(agw_config_load_file(path, err, sizeof(err)));
    cr_assert(strncmp(err, "invalid JSON at line 2", 22) == 0, "%s", err);
    unlink(path);
    cr_assert_null(agw_config_load_file(path, err, sizeof(err)));
    cr_assert_str_eq(err, "cannot open the file: No such file or directory");
}

Test(config, history_section_and_ttl_periods)
{
    char err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg =
        load("{" BASE "," AGENT
             ",\"history\":{\"enabled\":false,\"max_messages_per_thread\":5,\"ttl\":\"30d\","
             "\"cache_threads\":7},\"store\":{\"kind\":\"memory\"}}",
             err);
    uint64_t s;

    cr_assert_not_null(cfg, "%s", err);
    cr_assert_not(cfg->history.enabled);
    cr_assert_eq(cfg->history.max_messages_per_thread, 5);
    cr_assert_eq(cfg->history.ttl_s, 30u * 86400);
    cr_assert_eq(cfg->history.cache_threads, 7);
    cr_assert_eq(cfg->store.kind, AGW_STORE_MEMORY);
    agw_config_free(cfg);
    cr_assert_eq(agw_parse_ttl("0", &s), 0);
    cr_assert_eq(s, 0);
    cr_assert_eq(agw_parse_ttl("90m", &s), 0);
    cr_assert_eq(s, 5400);
    cr_assert_eq(agw_parse_ttl("12h", &s), 0);
    cr_assert_eq(s, 43200);
    cr_assert_eq(agw_parse_ttl("3600s", &s), 0);
    cr_assert_eq(s, 3600);
    cr_assert_eq(agw_parse_ttl("365d", &s), 0);
    cr_assert_eq(s, 365u * 86400);
    cr_assert_eq(agw_parse_ttl("", &s), -AGW_EINVAL);
    cr_assert_eq(agw_parse_ttl("d", &s), -AGW_EINVAL);
    cr_assert_eq(agw_parse_ttl("05d", &s), -AGW_EINVAL);
    cr_assert_eq(agw_parse_ttl("-1d", &s), -AGW_EINVAL);
    cr_assert_eq(agw_parse_ttl("1w", &s), -AGW_EINVAL);
    cr_assert_eq(agw_parse_ttl("99999999999999999999d", &s), -AGW_EINVAL);
}

#define KEYS(extra)                                                                                \
    "\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],\"auth\":{\"keys\":[{\"id\":\"web\","     \
    "\"sha256\":\"7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c\","             \
    "\"agents\":[\"*\"]" extra "},{\"id\":\"ops\",\"sha256\":"                                     \
    "\"7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2d\",\"agents\":[\"*\"]}]}"

Test(config, cors_section)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    struct agw_config *cfg = load("{" BASE "," AGENT "}", err);

    cr_assert_not_null(cfg, "%s", err);
    cr_assert_not(cfg->cors.enabled, "no cors object: no origin is allowed");
    agw_config_free(cfg);

    cfg = load("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"https://app.example.com\","
               "\"http://127.0.0.1:5173\",\"http://[::1]:8000\"]}}",
               err);
    cr_assert_not_null(cfg, "%s", err);
    cr_assert(cfg->cors.enabled);
    cr_assert_eq(cfg->cors.n_origins, 3);
    cr_assert_not(cfg->cors.any_origin);
    cr_assert_str_eq(cfg->cors.methods_value, "GET, POST, OPTIONS");
    cr_assert_str_eq(cfg->cors.headers_value,
                     "Authorization, Content-Type, Accept, X-Request-Id, traceparent");
    cr_assert_str_eq(cfg->cors.expose_value, "X-Request-Id, Retry-After");
    cr_assert_eq(cfg->cors.max_age_s, 600);
    cr_assert_not(cfg->cors.allow_credentials);
    agw_config_free(cfg);

    cfg = load("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"*\"],\"allowed_methods\":"
               "[\"POST\"],\"allowed_headers\":[],\"exposed_headers\":[],\"max_age\":\"1h\"}}",
               err);
    cr_assert_not_null(cfg, "%s", err);
    cr_assert(cfg->cors.any_origin);
    cr_assert_str_eq(cfg->cors.methods_value, "POST");
    cr_assert_str_eq(cfg->cors.headers_value, "");
    cr_assert_str_eq(cfg->cors.expose_value, "");
    cr_assert_eq(cfg->cors.max_age_s, 3600);
    agw_config_free(cfg);

    expect_error("{" BASE "," AGENT ",\"cors\":{}}", "cors.allowed_origins: required");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[]}}",
                 "cors.allowed_origins: required");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"https://a.example/\"]}}",
                 "cors.allowed_origins[0]: expects an origin as browsers send it");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"https://A.example\"]}}",
                 "cors.allowed_origins[0]: expects an origin");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"a.example\"]}}",
                 "cors.allowed_origins[0]: expects an origin");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"http://a:123456\"]}}",
                 "cors.allowed_origins[0]: expects an origin");
    expect_error("{" BASE "," AGENT
                 ",\"cors\":{\"allowed_origins\":[\"*\"],\"allow_credentials\":true}}",
                 "cors.allowed_origins: \"*\" cannot be used with allow_credentials");
    expect_error("{" BASE "," AGENT
                 ",\"cors\":{\"allowed_origins\":[\"*\"],\"allowed_methods\":[\"post\"]}}",
                 "cors.allowed_methods[0]: expects an HTTP method in upper case");
    expect_error("{" BASE "," AGENT
                 ",\"cors\":{\"allowed_origins\":[\"*\"],\"allowed_methods\":[]}}",
                 "cors.allowed_methods: expects at least one method");
    expect_error("{" BASE "," AGENT
                 ",\"cors\":{\"allowed_origins\":[\"*\"],\"allowed_headers\":[\"a b\"]}}",
                 "cors.allowed_headers[0]: expects a header name");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"*\"],\"max_age\":\"x\"}}",
                 "cors.max_age: expects a duration");
    expect_error("{" BASE "," AGENT ",\"cors\":{\"allowed_origins\":[\"*\"],\"origin\":1}}",
                 "cors.origin: unknown key");
}

Test(config, rate_limits)
{
    char err[AGW_CONFIG_ERR_MAX] = "";
    struct agw_config *cfg = load("{" KEYS("") "," AGENT "}", err);

    cr_assert_not_null(cfg, "%s", err);
    cr_assert_eq(cfg->auth.keys[0].rate_limit.runs_per_minute, 0, "no limit by default");
    cr_assert_eq(cfg->auth.keys[0].rate_limit.concurrent_runs, 0);
    agw_config_free(cfg);

    /* The top level is every key's default; a key overrides it field by field; a burst defaults
     * to a minute's worth of the key's own rate. */
    cfg = load(
        "{" KEYS(",\"rate_limit\":{\"runs_per_minute\":600}") "," AGENT
                                                              ",\"rate_limit\":{\"runs_per_"
                                                              "minute\":60,\"concurrent_runs\":4}}",
        err);
    cr_assert_not_null(cfg, "%s", err);
    cr_assert_eq(cfg->auth.keys[0].rate_limit.runs_per_minute, 600);
    cr_assert_eq(cfg->auth.keys[0].rate_limit.burst, 600);
    cr_assert_eq(cfg->auth.keys[0].rate_limit.concurrent_runs, 4);
    cr_assert_eq(cfg->auth.keys[1].rate_limit.runs_per_minute, 60);
    cr_assert_eq(cfg->auth.keys[1].rate_limit.burst, 60);
    cr_assert_eq(cfg->rate_limit.burst, 60);
    agw_config_free(cfg);

    cfg = load("{" KEYS(",\"rate_limit\":{\"runs_per_minute\":0}") "," AGENT
                                                                   ",\"rate_limit\":{\"runs_per_"
                                                                   "minute\":60,\"burst\":5}}",
               err);
    cr_assert_not_null(cfg, "%s", err);
    cr_assert_eq(cfg->auth.keys[0].rate_limit.runs_per_minute, 0, "a key may lift the rate");
    cr_assert_eq(cfg->auth.keys[0].rate_limit.burst, 0);
    cr_assert_eq(cfg->auth.keys[1].rate_limit.burst, 5);
    agw_config_free(cfg);

    expect_error("{" BASE "," AGENT ",\"rate_limit\":{\"burst\":5}}",
                 "rate_limit.burst: needs runs_per_minute");
    expect_error("{" BASE "," AGENT ",\"rate_limit\":{\"runs_per_minute\":-1}}",
                 "rate_limit.runs_per_minute: expects an integer 0..1000000");
    expect_error("{" BASE "," AGENT ",\"rate_limit\":{\"burst\":0,\"runs_per_minute\":1}}",
                 "rate_limit.burst: expects an integer 1..1000000");
    expect_error("{" BASE "," AGENT ",\"rate_limit\":{\"per_hour\":1}}",
                 "rate_limit.per_hour: unknown key");
    expect_error("{" KEYS(",\"rate_limit\":{\"concurrent_runs\":\"2\"}") "," AGENT "}",
                 "auth.keys[0].rate_limit.concurrent_runs: expects an integer");
}
