/* Tests for src/io.c over a socketpair whose send buffer is tiny: whatever point a write stops at
 * (inside what was queued, the frame's head, the body, its tail), what the peer reads is the bytes
 * in order, none lost or doubled; EAGAIN and a closed peer queue everything; a copy-write leaves
 * its source whole; reads append in place. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "agw/io.h"

static int sv[2]; /* sv[0] written by the code under test, sv[1] read by the test */

static void pair(int sndbuf)
{
    signal(SIGPIPE, SIG_IGN);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    for (int i = 0; i < 2; i++)
        fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK);
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
}

static void unpair(void)
{
    close(sv[0]);
    close(sv[1]);
}

/* Reads what sv[1] holds into <got> (appending). */
static void drain_peer(struct evbuffer *got)
{
    char buf[65536];
    ssize_t n;

    while ((n = read(sv[1], buf, sizeof(buf))) > 0)
        evbuffer_add(got, buf, (size_t)n);
}

/* Fills sv[0] until the socket takes nothing more; returns the bytes it took. */
static size_t fill(struct evbuffer *got_expect)
{
    char buf[512];
    size_t total = 0;
    ssize_t w;

    memset(buf, '#', sizeof(buf));
    while ((w = write(sv[0], buf, 1 + total % sizeof(buf))) > 0) {
        evbuffer_add(got_expect, buf, (size_t)w);
        total += (size_t)w;
    }
    return total;
}

/* A body of <n> bytes in several segments. */
static void make_body(struct evbuffer *body, struct evbuffer *expect, size_t n, unsigned seed)
{
    size_t off = 0;

    while (off < n) {
        size_t seg = 1 + (seed = seed * 1103515245u + 12345u) % 3000;
        char *b;
        if (seg > n - off)
            seg = n - off;
        b = malloc(seg);
        for (size_t i = 0; i < seg; i++)
            b[i] = (char)('a' + (off + i) % 26);
        evbuffer_add(body, b, seg);
        evbuffer_add(expect, b, seg);
        free(b);
        off += seg;
    }
}

static bool same(struct evbuffer *a, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(a);
    if (n != evbuffer_get_length(b))
        return false;
    return n == 0 || memcmp(evbuffer_pullup(a, -1), evbuffer_pullup(b, -1), n) == 0;
}

/* Pushes <out> to the socket until it is empty, reading the peer as it goes. */
static void flush_all(struct evbuffer *out, struct evbuffer *got)
{
    struct evbuffer *empty = evbuffer_new();

    for (int spin = 0; evbuffer_get_length(out) > 0 && spin < 100000; spin++) {
        drain_peer(got);
        cr_assert_geq(agw_io_write_framed(sv[0], out, NULL, 0, empty, NULL, 0), 0);
    }
    drain_peer(got);
    cr_assert_eq(evbuffer_get_length(out), 0);
    evbuffer_free(empty);
}

/* Every split point: the socket is filled, then the peer takes <room> bytes, so the write stops
 * <room> bytes in, for <room> across the queued bytes, the head, the body and the tail. */
Test(io, short_writes_at_every_split_keep_the_order)
{
    static char head[] = "1f4a\r\n", tail[] = "\r\n0\r\n\r\n";
    const struct iovec pre = {head, sizeof(head) - 1}, post = {tail, sizeof(tail) - 1};

    for (size_t room = 0; room < 3000; room += 7) {
        struct evbuffer *out = evbuffer_new(), *body = evbuffer_new(), *got = evbuffer_new(),
                        *expect = evbuffer_new();
        char buf[4096];

        pair(4096);
        evbuffer_add(out, "QUEUED-", 7); /* queued before: it goes first */
        fill(expect);
        evbuffer_add(expect, "QUEUED-", 7);
        evbuffer_add(expect, head, sizeof(head) - 1);
        make_body(body, expect, 2000, (unsigned)room);
        evbuffer_add(expect, tail, sizeof(tail) - 1);
        /* let the socket take exactly what the peer reads (at least <room>) */
        size_t took = 0;
        while (took < room) {
            ssize_t r = read(sv[1], buf, room - took < sizeof(buf) ? room - took : sizeof(buf));
            if (r <= 0)
                break;
            evbuffer_add(got, buf, (size_t)r);
            took += (size_t)r;
        }
        ssize_t w = agw_io_write_framed(sv[0], out, &pre, 1, body, &post, 1);
        cr_assert_geq(w, 0);
        cr_assert_eq(evbuffer_get_length(body), 0, "the body was moved");
        flush_all(out, got);
        cr_assert(same(got, expect), "room %zu: the peer read other bytes", room);
        evbuffer_free(out);
        evbuffer_free(body);
        evbuffer_free(got);
        evbuffer_free(expect);
        unpair();
    }
}

Test(io, whole_writes_leave_nothing_queued)
{
    struct evbuffer *out = evbuffer_new(), *body = evbuffer_new(), *got = evbuffer_new(),
                    *expect = evbuffer_new();
    char h[] = "5\r\n", t[] = "\r\n";
    struct iovec pre = {h, 3}, post = {t, 2};

    pair(1 << 20);
    evbuffer_add(body, "hello", 5);
    evbuffer_add(expect, "5\r\nhello\r\n", 10);
    cr_assert_eq(agw_io_write_framed(sv[0], out, &pre, 1, body, &post, 1), 10);
    cr_assert_eq(evbuffer_get_length(out), 0);
    drain_peer(got);
    cr_assert(same(got, expect));
    evbuffer_free(out);
    evbuffer_free(body);
    evbuffer_free(got);
    evbuffer_free(expect);
    unpair();
}

Test(io, a_full_socket_or_a_closed_peer_queue_everything)
{
    struct evbuffer *out = evbuffer_new(), *body = evbuffer_new(), *sink = evbuffer_new();
    char h[] = "3\r\n", t[] = "\r\n";
    struct iovec pre = {h, 3}, post = {t, 2};

    pair(4096);
    fill(sink);
    evbuffer_add(body, "abc", 3);
    errno = 0;
    cr_assert_eq(agw_io_write_framed(sv[0], out, &pre, 1, body, &post, 1), 0);
    cr_assert_eq(errno, EAGAIN);
    cr_assert_eq(evbuffer_get_length(out), 8);
    cr_assert(memcmp(evbuffer_pullup(out, -1), "3\r\nabc\r\n", 8) == 0);
    close(sv[1]);
    evbuffer_add(body, "def", 3);
    cr_assert_eq(agw_io_write_framed(sv[0], out, &pre, 1, body, &post, 1), 0);
    cr_assert(errno == EPIPE || errno == ECONNRESET, "errno %d", errno);
    cr_assert_eq(evbuffer_get_length(out), 16, "queued in order behind the rest");
    cr_assert(memcmp(evbuffer_pullup(out, -1), "3\r\nabc\r\n3\r\ndef\r\n", 16) == 0);
    close(sv[0]);
    evbuffer_free(out);
    evbuffer_free(body);
    evbuffer_free(sink);
}

Test(io, too_many_pieces_does_nothing)
{
    struct evbuffer *out = evbuffer_new(), *body = evbuffer_new();

    pair(1 << 16);
    static const char xs[AGW_IO_MAX_PIECES + 1] = {0};
    for (int i = 0; i < AGW_IO_MAX_PIECES + 1; i++)
        evbuffer_add_reference(body, xs + i, 1, NULL, NULL); /* a chain each */
    cr_assert_eq(agw_io_write_framed(sv[0], out, NULL, 0, body, NULL, 0), -1);
    cr_assert_eq(evbuffer_get_length(body), AGW_IO_MAX_PIECES + 1, "untouched");
    cr_assert_eq(evbuffer_get_length(out), 0);
    evbuffer_free(out);
    evbuffer_free(body);
    unpair();
}

Test(io, a_copy_write_keeps_its_source)
{
    for (size_t room = 0; room < 2000; room += 13) {
        struct evbuffer *src = evbuffer_new(), *out = evbuffer_new(), *got = evbuffer_new(),
                        *expect = evbuffer_new();
        char buf[4096];

        pair(4096);
        fill(expect);
        make_body(src, expect, 1500, (unsigned)room + 1);
        size_t took = 0;
        while (took < room) {
            ssize_t r = read(sv[1], buf, room - took < sizeof(buf) ? room - took : sizeof(buf));
            if (r <= 0)
                break;
            evbuffer_add(got, buf, (size_t)r);
            took += (size_t)r;
        }
        cr_assert_geq(agw_io_write_copy(sv[0], src, out), 0);
        cr_assert_eq(evbuffer_get_length(src), 1500, "the source stays whole");
        flush_all(out, got);
        cr_assert(same(got, expect), "room %zu", room);
        evbuffer_free(src);
        evbuffer_free(out);
        evbuffer_free(got);
        evbuffer_free(expect);
        unpair();
    }
}

Test(io, reads_append_in_place)
{
    struct evbuffer *in = evbuffer_new();
    char b[8];

    pair(1 << 16);
    evbuffer_add(in, "old:", 4);
    cr_assert_eq(write(sv[1], "new bytes", 9), 9);
    cr_assert_eq(agw_io_read_into(in, sv[0], 4096), 9);
    cr_assert_eq(evbuffer_get_length(in), 13);
    cr_assert(memcmp(evbuffer_pullup(in, -1), "old:new bytes", 13) == 0);
    errno = 0;
    cr_assert_eq(agw_io_read_into(in, sv[0], 4096), -1);
    cr_assert_eq(errno, EAGAIN);
    cr_assert_eq(write(sv[1], "xy", 2), 2);
    cr_assert_eq(agw_io_read(sv[0], b, sizeof(b)), 2);
    close(sv[1]);
    cr_assert_eq(agw_io_read(sv[0], b, sizeof(b)), 0, "EOF");
    close(sv[0]);
    evbuffer_free(in);
}

/* The reads are socket reads (recv(), which skips read()'s file layer): a pipe is refused. */
Test(io, reads_are_socket_reads)
{
    int p[2];
    char b[8];
    struct evbuffer *in = evbuffer_new();

    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(write(p[1], "ab", 2), 2);
    errno = 0;
    cr_assert_eq(agw_io_read(p[0], b, sizeof(b)), -1);
    cr_assert_eq(errno, ENOTSOCK);
    errno = 0;
    cr_assert_eq(agw_io_read_append(in, p[0], 4096), -1);
    cr_assert_eq(errno, ENOTSOCK);
    cr_assert_eq(evbuffer_get_length(in), 0);
    close(p[0]);
    close(p[1]);
    evbuffer_free(in);
}

/* The gate's reads (src/http_server.c) go to a buffer of its own, which must stay open at its end
 * for what the gate appends itself; a bufferevent's input stays frozen at its end, as the
 * bufferevent keeps it outside its reads. */
Test(io, reads_leave_the_buffer_as_they_found_it)
{
    struct evbuffer *own = evbuffer_new(), *in = evbuffer_new();

    pair(1 << 16);
    cr_assert_eq(write(sv[1], "abc", 3), 3);
    cr_assert_eq(agw_io_read_append(own, sv[0], 2), 2, "at most <max> bytes");
    cr_assert_eq(agw_io_read_append(own, sv[0], 4096), 1);
    cr_assert_eq(evbuffer_add(own, "d", 1), 0, "the end of a buffer of one's own is not frozen");
    cr_assert(memcmp(evbuffer_pullup(own, -1), "abcd", 4) == 0);
    errno = 0;
    cr_assert_eq(agw_io_read_append(own, sv[0], 4096), -1);
    cr_assert_eq(errno, EAGAIN);
    evbuffer_freeze(in, 0);
    cr_assert_eq(write(sv[1], "e", 1), 1);
    cr_assert_eq(agw_io_read_into(in, sv[0], 4096), 1);
    cr_assert_eq(evbuffer_add(in, "f", 1), -1, "a bufferevent's input stays frozen at its end");
    close(sv[1]);
    cr_assert_eq(agw_io_read_append(own, sv[0], 4096), 0, "EOF");
    close(sv[0]);
    evbuffer_free(own);
    evbuffer_free(in);
}
