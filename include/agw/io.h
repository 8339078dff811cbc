/* fd-level I/O on non-blocking sockets, for the hot paths of both sides: one read per readiness
 * (into a memory block or an evbuffer), and one writev() of a message's pieces with no copy,
 * whatever the socket does not take queued, in order, behind what was queued before. The only
 * module that calls read(), readv() or writev() on a socket; the others stay within their
 * libraries' public APIs. Plain system calls and evbuffers: no event loop, no bufferevent
 * internals, testable over a socketpair. (TLS connections do not come here: their bytes go through
 * OpenSSL, by their bufferevent.)
 *
 * Queues are evbuffers that belong to a bufferevent: libevent keeps an output's front and an
 * input's end frozen outside its own writes and reads, so these functions thaw them for exactly
 * their own change, as libevent does. */
#ifndef AGW_IO_H
#define AGW_IO_H

#include <sys/types.h>
#include <sys/uio.h>

#include "agw/common.h"

struct evbuffer;

/* Pieces one writev() takes at most (a chunk header, a body's segments, a trailer). */
#define AGW_IO_MAX_PIECES 32

/* One read of at most <len> bytes into <buf> from the socket <fd> (recv()). Returns what recv()
 * returned; errno is recv()'s. */
ssize_t agw_io_read(int fd, char *buf, size_t len);

/* Whether an idle connection is still clean: 0 when nothing waits to be read (the peer sent nothing
 * and did not close), 1 when bytes wait (nobody asked for them), -1 when the peer closed or the
 * socket failed. One recv(MSG_PEEK) that reads nothing out. */
int agw_io_idle_state(int fd);

/* One read (recv()) of at most <max> bytes from the socket <fd> appended to <in>, a bufferevent's
 * input (whose end the bufferevent keeps frozen outside its reads). Returns what recv() returned.
 */
ssize_t agw_io_read_into(struct evbuffer *in, int fd, size_t max);

/* The same for a buffer of one's own (not frozen). Either reads at most 64 KiB at once. */
ssize_t agw_io_read_append(struct evbuffer *in, int fd, size_t max);

/* One writev() of, in order: what <out> holds (queued earlier), <pre> (<npre> pieces), every byte
 * of <body> (NULL: none), <post> (<npost> pieces). What the socket took leaves <out>'s front; what
 * it did not take stays queued in <out>, in order: <pre> and <post> copied, <body>'s bytes moved
 * (no copy). <body> is empty afterwards. Returns the bytes written (0 on EAGAIN or an error — errno
 * tells; everything is queued then, for the bufferevent to find the error), or -1, having done
 * nothing, when the pieces do not fit one writev() (AGW_IO_MAX_PIECES). */
ssize_t agw_io_write_framed(int fd, struct evbuffer *out, const struct iovec *pre, int npre,
                            struct evbuffer *body, const struct iovec *post, int npost);

/* One writev() of <src>'s bytes, which stay in <src> (a request kept for a retry). What the socket
 * did not take is copied to the end of <out>. Returns the bytes written (0 on EAGAIN or an error:
 * everything is then queued, and errno is writev()'s; 0 for nothing to write), or -1, having done
 * nothing, when <src> has too many segments. */
ssize_t agw_io_write_copy(int fd, struct evbuffer *src, struct evbuffer *out);

#endif
