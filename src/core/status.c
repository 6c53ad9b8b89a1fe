/*
 * Status names, version, and the thread-local error message.
 * Messages read "<op>: <argument>: <rule broken>", e.g.
 *   "lk_rms_norm: w: shape [127] does not match last dim of x (128)".
 */
#include <stdarg.h>
#include <stdio.h>

#include "core.h"

static _Thread_local char lk_err_buf[512];
static _Thread_local const char *lk_err_op = "llmkern";

void lk_set_op(const char *op) { lk_err_op = op; }

void lk_clear_error(void) { lk_err_buf[0] = '\0'; }

lk_status lk_fail(lk_status s, const char *fmt, ...) {
    int n = snprintf(lk_err_buf, sizeof lk_err_buf, "%s: ", lk_err_op);
    if (n < 0 || (size_t)n >= sizeof lk_err_buf) return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lk_err_buf + n, sizeof lk_err_buf - (size_t)n, fmt, ap);
    va_end(ap);
    return s;
}

const char *lk_last_error(void) { return lk_err_buf; }

const char *lk_status_str(lk_status s) {
    switch (s) {
    case LK_OK: return "LK_OK";
    case LK_ERR_NULL: return "LK_ERR_NULL";
    case LK_ERR_RANK: return "LK_ERR_RANK";
    case LK_ERR_SHAPE: return "LK_ERR_SHAPE";
    case LK_ERR_DTYPE: return "LK_ERR_DTYPE";
    case LK_ERR_LAYOUT: return "LK_ERR_LAYOUT";
    case LK_ERR_INDEX: return "LK_ERR_INDEX";
    case LK_ERR_ALIAS: return "LK_ERR_ALIAS";
    case LK_ERR_OVERFLOW: return "LK_ERR_OVERFLOW";
    case LK_ERR_VALUE: return "LK_ERR_VALUE";
    case LK_ERR_UNSUPPORTED: return "LK_ERR_UNSUPPORTED";
    case LK_ERR_NOMEM: return "LK_ERR_NOMEM";
    }
    return "LK_ERR_UNKNOWN";
}

const char *lk_version(void) { return LLMKERN_VERSION_STRING; }
