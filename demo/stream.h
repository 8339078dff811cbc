/* Producing a run's response on its connection (doc/demo-agent.md, "Implementation notes"): after
 * first_byte_delay_ms the status line (or the status knob's JSON error), then the plan's events in
 * batches, framed as the framing knob says (chunked, close-delimited, or held whole for a
 * Content-Length), until the plan's end, drop_after, a stall or a wait for a decision (hitl.h).
 * Backpressure: production stops while OUT_HIGH bytes are queued (http.h) and resumes from the
 * write callback; paced runs (delay_ms, bytewise) produce one event per timer or write.
 *
 * The connection owns its run from handle_run() until run_end(). */
#ifndef DEMO_STREAM_H
#define DEMO_STREAM_H

struct conn;

/* The run is over (completed, dropped or abandoned; the caller counts which): out of the active
 * (and waiting) counts, freed, c->run = NULL. */
void run_end(struct conn *c);
/* Produces the next batch of c->run's events and arranges what resumes it. In CONN_ST_STREAM. */
void pump(struct conn *c);
/* first_byte_delay_ms has passed (CONN_ST_DELAY): answers the status knob, or starts the stream. */
void start_response(struct conn *c);

#endif
