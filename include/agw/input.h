/* RunAgentInput validation (doc/protocol.md#validation) and request classification
 * (doc/protocol.md#decisions). Pure: reads the body, never rewrites it. */
#ifndef AGW_INPUT_H
#define AGW_INPUT_H

#include "agw/common.h"

/* Where one element of the body's "messages" lies in the body, and its id's bytes (offsets from the
 * body's first byte). */
struct agw_input_message {
    size_t off, len;
    size_t id_off, id_len;
};

/* What the gateway needs to know about a valid request. Owns its strings; clear with
 * agw_input_clear(). */
struct agw_input {
    char *thread_id;
    char *run_id;
    bool has_user_input; /* a "user" message with non-blank content */
    bool has_decision;   /* a "tool" message with a toolCallId */
    bool decision_only;  /* !has_user_input && has_decision */
    /* The scanner's reading of "messages", for the thread history (which then need not read the
     * body again): each element an object whose "id" is a string written without an escape, as
     * agw_capture_input_messages() gives them; <messages_read> false when not asked for
     * (agw_input_parse()), when the scanner did not read the body, or when some element is not
     * such an object (then <messages> is NULL). */
    bool messages_read;
    struct agw_input_message *messages;
    size_t n_messages;
};

#define AGW_INPUT_ERR_MAX 256

/* True when <content_type> is application/json, optionally with parameters (case-insensitive). */
bool agw_input_content_type_ok(const char *content_type);

/* Validates <body> (<len> bytes, not necessarily NUL-terminated). Returns 0 and fills <in>, or an
 * HTTP status (400, 422) with the error message in <err>, e.g. "bad request: threadId cannot be
 * empty" or "messages[2].toolCallId is required". JSON nested deeper than <max_depth> is a 400 (0 =
 * the default, 64). Checks run in the order depth, JSON, object, threadId, runId, messages, tools,
 * context; the first failure is reported. Messages name field paths and never quote the body. An
 * optional field that is null counts as absent. <in> is overwritten without being freed (pass a
 * zeroed or cleared one) and is left zeroed on error; <err> may be NULL when <errlen> is 0. */
int agw_input_parse(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                    char *err, size_t errlen);
/* agw_input_parse() that also keeps the scanner's reading of the messages (messages_read), for a
 * gateway that records thread history. */
int agw_input_parse_keep(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                         char *err, size_t errlen);
/* The two readings agw_input_parse() makes, for tests. The scanner's (no tree, no allocation but
 * the ids and the messages' reading): true when it reads <body> as valid, with <in> filled as
 * agw_input_parse_keep() fills it (the depth limit is not its to check); false when it does not
 * judge (<in> zeroed). jansson's:
 * agw_input_parse() without the scanner, the reading that decides whatever the scanner does not
 * judge. */
bool agw_input_scan(const char *body, size_t len, struct agw_input *in);
int agw_input_parse_jansson(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                            char *err, size_t errlen);
/* Frees <in>'s strings and zeroes it; safe on a zeroed struct and on NULL. */
void agw_input_clear(struct agw_input *in);

#endif
