/*
 * Per-thread trace text (see trace.h): one 2 KiB buffer, the time of the last item and
 * a mute flag per thread, all _Thread_local, so concurrent calls on different threads
 * keep separate traces.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "trace.h"

static _Thread_local char trace_buf[2048];
static _Thread_local size_t trace_len;
static _Thread_local double trace_t; /* time of the last item or reset */
static _Thread_local int trace_muted;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void lk_trace_reset(void) {
    trace_buf[0] = 0;
    trace_len = 0;
    trace_t = now_s();
}

static void trace_append(const char *fmt, ...) {
    size_t cap = sizeof trace_buf;
    if (trace_len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(trace_buf + trace_len, cap - trace_len, fmt, ap);
    va_end(ap);
    if (n > 0) trace_len += (size_t)n < cap - trace_len ? (size_t)n : cap - 1 - trace_len;
}

void lk_trace_item(const char *fmt, ...) {
    char item[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    double t = now_s();
    if (!trace_muted) trace_append("%s%s [%.3f ms]", trace_len ? "; " : "", item, 1e3 * (t - trace_t));
    trace_t = t;
}

void lk_trace_mute(int on) { trace_muted = on != 0; }

const char *lk_trace_text(void) { return trace_buf; }
