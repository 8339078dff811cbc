/* Tests for src/mem.c: the heap's return of freed pages runs in background threads of its own, at
 * nice 19, with jemalloc (the default build), and is not claimed with the C library's malloc (the
 * sanitized builds). */
#include "config.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "agw/mem.h"

/* How many threads of this process are named <name>; the nice value of the last in <nice>. */
static int threads_named(const char *name, int *nice)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL) {
        char path[300], comm[64] = "";
        FILE *f;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue; /* the thread ended */
        if (fgets(comm, sizeof(comm), f) != NULL)
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (strcmp(comm, name) != 0)
            continue;
        n++;
        *nice = getpriority(PRIO_PROCESS, (id_t)strtol(e->d_name, NULL, 10));
    }
    closedir(d);
    return n;
}

Test(mem, purging_runs_in_background_threads_at_nice_19)
{
    int nice = 0;
    bool on = agw_mem_purge_in_background();

#ifdef HAVE_JEMALLOC
    bool now = false;
    size_t len = sizeof(now);

    cr_assert(on, "jemalloc: its background threads start");
    cr_assert_eq(mallctl("background_thread", &now, &len, NULL, 0), 0);
    cr_assert(now, "jemalloc reports its background threads on");
    /* (the thread names itself once it runs: on a busy machine, some time after the start) */
    int n = 0;
    for (int i = 0; i < 500 && (n = threads_named("jemalloc_bg_thd", &nice)) == 0; i++)
        usleep(10000);
    cr_assert_geq(n, 1, "a background thread runs");
    cr_assert_eq(nice, 19, "it runs at nice 19, not the loops' 0 (got %d)", nice);
    cr_assert_eq(getpriority(PRIO_PROCESS, 0), 0, "the calling thread keeps its nice value");
#else
    cr_assert(!on, "the C library's malloc has no background purging to start");
    cr_assert_eq(threads_named("jemalloc_bg_thd", &nice), 0);
#endif
}
