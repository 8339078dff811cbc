/* Tests for src/ratelimit.c: the token bucket (burst, refill, Retry-After), the concurrent-run
 * ceiling, reloads keeping each key's state, and the counters. Time is given, never read. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/ratelimit.h"

static struct agw_config *load(const char *web_limit, const char *top)
{
    char json[2048], err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg;

    snprintf(json, sizeof(json),
             "{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],"
             "\"auth\":{\"keys\":[{\"id\":\"web\",\"sha256\":"
             "\"7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c\","
             "\"agents\":[\"*\"]%s%s},{\"id\":\"ops\",\"sha256\":"
             "\"7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2d\","
             "\"agents\":[\"*\"]}]},"
             "\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/\"]}}%s%s}",
             web_limit != NULL ? ",\"rate_limit\":" : "", web_limit != NULL ? web_limit : "",
             top != NULL ? ",\"rate_limit\":" : "", top != NULL ? top : "");
    cfg = agw_config_load_string(json, err, sizeof(err));
    cr_assert_not_null(cfg, "%s", err);
    return cfg;
}

Test(ratelimit, bucket_burst_refill_and_retry_after)
{
    struct agw_config *cfg = load("{\"runs_per_minute\":6,\"burst\":3}", NULL);
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct agw_rl_entry *e;
    uint32_t retry;
    uint64_t t = 1000000;

    agw_ratelimit_configure(rl, cfg, t);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(agw_ratelimit_acquire(rl, "web", t, &retry, &e), AGW_RL_OK, "burst run %d", i);
        agw_ratelimit_release(rl, e);
    }
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", t, &retry, &e), AGW_RL_RATE);
    cr_assert_null(e);
    cr_assert_eq(retry, 10, "6 runs per minute: one every 10 s");
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", t + 9000, &retry, &e), AGW_RL_RATE);
    cr_assert_eq(retry, 1, "1 s to go");
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", t + 10000, &retry, &e), AGW_RL_OK);
    agw_ratelimit_release(rl, e);
    /* A long pause refills no further than the burst. */
    t += 3600 * 1000;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(agw_ratelimit_acquire(rl, "web", t, &retry, &e), AGW_RL_OK);
        agw_ratelimit_release(rl, e);
    }
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", t, &retry, &e), AGW_RL_RATE);
    /* Another key has no limit: never refused, but its runs are counted. */
    for (int i = 0; i < 100; i++)
        cr_assert_eq(agw_ratelimit_acquire(rl, "ops", t, &retry, &e), AGW_RL_OK);
    cr_assert_eq(agw_ratelimit_active(rl, "ops"), 100);
    cr_assert_eq(agw_ratelimit_acquire(rl, "nobody", t, &retry, &e), AGW_RL_OK);
    cr_assert_null(e, "an unknown key takes nothing");
    agw_ratelimit_free(rl);
    agw_config_free(cfg);
}

Test(ratelimit, concurrent_runs)
{
    struct agw_config *cfg = load("{\"concurrent_runs\":2}", NULL);
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct agw_rl_entry *a, *b, *c;
    uint32_t retry;

    agw_ratelimit_configure(rl, cfg, 0);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &a), AGW_RL_OK);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &b), AGW_RL_OK);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &c), AGW_RL_CONCURRENCY);
    cr_assert_eq(retry, 1);
    cr_assert_eq(agw_ratelimit_active(rl, "web"), 2);
    agw_ratelimit_release(rl, a);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &c), AGW_RL_OK, "a slot freed");
    agw_ratelimit_release(rl, b);
    agw_ratelimit_release(rl, c);
    agw_ratelimit_release(rl, NULL);
    cr_assert_eq(agw_ratelimit_active(rl, "web"), 0);
    agw_ratelimit_free(rl);
    agw_config_free(cfg);
}

/* A reload keeps a key's running runs and its bucket; a key that goes loses its limits but its
 * runs still end cleanly; a key that comes starts full. */
Test(ratelimit, reload_keeps_state)
{
    struct agw_config *v1 =
        load("{\"runs_per_minute\":60,\"burst\":2,\"concurrent_runs\":5}", NULL);
    struct agw_config *v2 =
        load("{\"runs_per_minute\":60,\"burst\":2,\"concurrent_runs\":1}", NULL);
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct agw_rl_entry *a, *b;
    uint32_t retry;

    agw_ratelimit_configure(rl, v1, 0);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &a), AGW_RL_OK);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &b), AGW_RL_OK);
    agw_ratelimit_release(rl, b);
    agw_ratelimit_configure(rl, v2, 0);
    cr_assert_eq(agw_ratelimit_active(rl, "web"), 1, "the running run is still counted");
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &b), AGW_RL_CONCURRENCY,
                 "the new ceiling counts the run that started before the reload");
    agw_ratelimit_release(rl, a);
    cr_assert_eq(agw_ratelimit_acquire(rl, "web", 0, &retry, &b), AGW_RL_RATE,
                 "the bucket kept its state across the reload");
    agw_ratelimit_free(rl);
    agw_config_free(v1);
    agw_config_free(v2);
}

Test(ratelimit, auth_off_uses_the_top_level_limit)
{
    char err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg = agw_config_load_string(
        "{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],\"auth\":{\"mode\":\"none\"},"
        "\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/\"]}},"
        "\"rate_limit\":{\"concurrent_runs\":1}}",
        err, sizeof(err));
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct agw_rl_entry *a, *b;
    uint32_t retry;

    cr_assert_not_null(cfg, "%s", err);
    agw_ratelimit_configure(rl, cfg, 0);
    cr_assert_eq(agw_ratelimit_acquire(rl, "", 0, &retry, &a), AGW_RL_OK);
    cr_assert_eq(agw_ratelimit_acquire(rl, "", 0, &retry, &b), AGW_RL_CONCURRENCY);
    agw_ratelimit_release(rl, a);
    agw_ratelimit_free(rl);
    agw_config_free(cfg);
}

Test(ratelimit, metrics)
{
    struct agw_config *cfg = load("{\"concurrent_runs\":1}", NULL);
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct evbuffer *b = evbuffer_new();
    struct agw_rl_entry *a, *x;
    uint32_t retry;
    char *text;

    agw_ratelimit_configure(rl, cfg, 0);
    agw_ratelimit_acquire(rl, "web", 0, &retry, &a);
    agw_ratelimit_acquire(rl, "web", 0, &retry, &x);
    agw_ratelimit_acquire(rl, "web", 0, &retry, &x);
    agw_ratelimit_write_metrics(rl, b);
    evbuffer_add(b, "", 1);
    text = (char *)evbuffer_pullup(b, -1);
    cr_assert_not_null(strstr(text, "# TYPE agw_rate_limited_total counter\n"), "%s", text);
    cr_assert_not_null(
        strstr(text, "agw_rate_limited_total{key=\"web\",limit=\"concurrent_runs\"} 2\n"), "%s",
        text);
    cr_assert_not_null(
        strstr(text, "agw_rate_limited_total{key=\"web\",limit=\"runs_per_minute\"} 0\n"), "%s",
        text);
    cr_assert_not_null(strstr(text, "agw_key_active_runs{key=\"web\"} 1\n"), "%s", text);
    cr_assert_not_null(strstr(text, "agw_key_active_runs{key=\"ops\"} 0\n"), "%s", text);
    agw_ratelimit_release(rl, a);
    evbuffer_free(b);
    agw_ratelimit_free(rl);
    agw_config_free(cfg);
}

/* Several loops count into one object: no run is lost or counted twice. */
struct hammer {
    struct agw_ratelimit *rl;
    unsigned ok;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    struct agw_rl_entry *e;
    uint32_t retry;

    for (int i = 0; i < 20000; i++) {
        if (agw_ratelimit_acquire(h->rl, "web", 0, &retry, &e) == AGW_RL_OK) {
            h->ok++;
            agw_ratelimit_release(h->rl, e);
        }
    }
    return NULL;
}

Test(ratelimit, threads)
{
    struct agw_config *cfg = load("{\"runs_per_minute\":1000,\"burst\":1000}", NULL);
    struct agw_ratelimit *rl = agw_ratelimit_new();
    struct hammer h[4];
    pthread_t t[4];
    unsigned total = 0;

    agw_ratelimit_configure(rl, cfg, 0);
    for (int i = 0; i < 4; i++) {
        h[i] = (struct hammer){rl, 0};
        pthread_create(&t[i], NULL, hammer_main, &h[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        total += h[i].ok;
    }
    cr_assert_eq(total, 1000, "exactly the burst passes at one instant, got %u", total);
    cr_assert_eq(agw_ratelimit_active(rl, "web"), 0);
    agw_ratelimit_free(rl);
    agw_config_free(cfg);
}
