/*
 * Per-thread trace of one call: a short text of "; "-separated items, each the name and
 * sizes of an internal op followed by its wall time, "<item> [<ms> ms]". An item is
 * appended when its op is done, so its time is the time since the previous item (or
 * since the reset). The buffer holds 2 KiB; items past it are dropped.
 * Used by MLA prefix prefill (lk_mla_last_trace() returns the text).
 */
#ifndef LK_TRACE_H
#define LK_TRACE_H

/* empty text, clock restarted */
void lk_trace_reset(void);
/* append "<formatted> [t ms]" (after "; " unless first); while muted only the clock
 * moves on */
void lk_trace_item(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* on != 0: later items are not listed (repeated work, e.g. the waves after the first) */
void lk_trace_mute(int on);
/* this thread's text, valid until its next reset or item */
const char *lk_trace_text(void);

#endif
