/* The loop probe (include/agw/loop_probe.h): a timerfd at the loop's highest priority, and the
 * loop thread's scheduler statistics read at each expiry it serves. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <event2/event.h>
#include "agw/common.h"
#include "agw/loop_probe.h"

struct agw_loop_probe {
    struct event *ev; /* on the timerfd */
    uint64_t period_us;
    uint64_t start_us; /* when the timer was armed */
    uint64_t expired;  /* expiries served */
    int sched_fd;      /* this loop thread's schedstat; -1: none */
    uint64_t wait_ns;  /* its time waiting for a CPU, at the last expiry served */
    uint64_t run_ns;   /* its time on a CPU, then */
    /* The maxima, read from any thread: relaxed atomics. */
    uint64_t late_max_us, own_max_us, running_max_us;
    int has_sched; /* atomic: sched_fd was opened */
    uint64_t report_us;
    struct agw_loop_lateness *records; /* AGW_LOOP_PROBE_RECORDS; NULL: report_us is 0 */
    size_t n_records;
    uint64_t lost;
};

/* The thread's time on a CPU and in the run queue (ns): schedstat's first two fields. */
static void sched_times(int fd, uint64_t *run_ns, uint64_t *wait_ns)
{
    char buf[96], *p;
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

    *run_ns = *wait_ns = 0;
    if (n <= 0)
        return;
    buf[n] = '\0';
    *run_ns = strtoull(buf, &p, 10);
    *wait_ns = strtoull(p, NULL, 10);
}

static void raise_max(uint64_t *max, uint64_t v)
{
    if (v > __atomic_load_n(max, __ATOMIC_RELAXED))
        __atomic_store_n(max, v, __ATOMIC_RELAXED);
}

static uint32_t clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static void probe_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_loop_probe *p = arg;
    uint64_t expired = 0, now, due, late, own = 0, running = 0;

    (void)what;
    if (read(fd, &expired, sizeof(expired)) != (ssize_t)sizeof(expired) || expired == 0)
        return;
    now = agw_now_us();
    due = p->start_us + (p->expired + 1) * p->period_us; /* the first expiry not served */
    late = now > due ? now - due : 0;
    p->expired += expired;
    raise_max(&p->late_max_us, late);
    if (p->sched_fd >= 0) {
        uint64_t run_ns, wait_ns, waited_us, ran_us;

        sched_times(p->sched_fd, &run_ns, &wait_ns);
        waited_us = (wait_ns - p->wait_ns) / 1000u; /* in the run queue since the last expiry */
        ran_us = (run_ns - p->run_ns) / 1000u;      /* on a CPU since then */
        own = late > waited_us ? late - waited_us : 0;
        running = own < ran_us ? own : ran_us;
        p->wait_ns = wait_ns;
        p->run_ns = run_ns;
        raise_max(&p->own_max_us, own);
        raise_max(&p->running_max_us, running);
    }
    if (p->records != NULL && late >= p->report_us) {
        if (p->n_records < AGW_LOOP_PROBE_RECORDS)
            p->records[p->n_records++] = (struct agw_loop_lateness){
                .at_us = now,
                .late_us = clamp32(late),
                .own_us = clamp32(own),
                .running_us = clamp32(running),
            };
        else
            p->lost++;
    }
}

/* Arms the timer once the loop runs. The schedstat file is opened here, on the loop's thread:
 * "thread-self" is the thread that opens it. */
static void arm_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_loop_probe *p = arg;
    struct itimerspec its;

    (void)fd;
    (void)what;
    its.it_interval.tv_sec = (time_t)(p->period_us / 1000000u);
    its.it_interval.tv_nsec = (long)(p->period_us % 1000000u) * 1000L;
    its.it_value = its.it_interval;
    p->start_us = agw_now_us();
    p->expired = 0;
    p->sched_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (p->sched_fd >= 0) {
        sched_times(p->sched_fd, &p->run_ns, &p->wait_ns);
        __atomic_store_n(&p->has_sched, 1, __ATOMIC_RELEASE);
    }
    timerfd_settime(event_get_fd(p->ev), 0, &its, NULL);
}

struct agw_loop_probe *agw_loop_probe_new(struct event_base *base, uint64_t period_us,
                                          uint64_t report_us)
{
    const struct timeval now = {0, 0};
    struct agw_loop_probe *p;
    int fd;

    if (period_us < 1000 || period_us > 10000000) {
        errno = EINVAL;
        return NULL;
    }
    fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    p = agw_xcalloc(1, sizeof(*p));
    p->period_us = period_us;
    p->sched_fd = -1;
    p->report_us = report_us;
    if (report_us > 0)
        p->records = agw_xcalloc(AGW_LOOP_PROBE_RECORDS, sizeof(*p->records));
    /* The highest priority: it measures the loop, it must not wait behind a busy one's work. */
    p->ev = event_new(base, fd, EV_READ | EV_PERSIST, probe_cb, p);
    event_priority_set(p->ev, 0);
    event_add(p->ev, NULL);
    event_base_once(base, -1, EV_TIMEOUT, arm_cb, p, &now);
    return p;
}

void agw_loop_probe_free(struct agw_loop_probe *p)
{
    if (p == NULL)
        return;
    close(event_get_fd(p->ev));
    event_free(p->ev);
    if (p->sched_fd >= 0)
        close(p->sched_fd);
    free(p->records);
    free(p);
}

void agw_loop_probe_maxima(const struct agw_loop_probe *p, struct agw_loop_probe_maxima *out)
{
    bool sched = __atomic_load_n(&p->has_sched, __ATOMIC_ACQUIRE) != 0;

    out->late_us = (int64_t)__atomic_load_n(&p->late_max_us, __ATOMIC_RELAXED);
    out->own_us = sched ? (int64_t)__atomic_load_n(&p->own_max_us, __ATOMIC_RELAXED) : -1;
    out->running_us = sched ? (int64_t)__atomic_load_n(&p->running_max_us, __ATOMIC_RELAXED) : -1;
}

const struct agw_loop_lateness *agw_loop_probe_records(const struct agw_loop_probe *p, size_t *n,
                                                       uint64_t *lost)
{
    *n = p->n_records;
    *lost = p->lost;
    return p->records;
}

void agw_loop_probe_format(const struct agw_loop_lateness *l, char *buf, size_t len)
{
    snprintf(buf, len, "loop probe: late %.3f ms at %.6f s; own %.3f ms, running %.3f ms",
             l->late_us / 1e3, l->at_us / 1e6, l->own_us / 1e3, l->running_us / 1e3);
}

void agw_loop_probe_env(uint64_t *period_us, uint64_t *report_us)
{
    const char *v = getenv("AGW_LOOP_PROBE_MS");
    const char *r = getenv("AGW_LOOP_PROBE_REPORT_MS");
    long ms = v != NULL ? strtol(v, NULL, 10) : 0;
    double rms = r != NULL ? strtod(r, NULL) : 0;

    *period_us = ms >= 1 && ms <= 10000 ? (uint64_t)ms * 1000u : 0;
    *report_us = rms >= 0.001 && rms <= 10000 ? (uint64_t)(rms * 1000) : 0;
}
