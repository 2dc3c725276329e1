/* smla_fail: the one way C code reports an error (docs/design.md section 1: never exit, abort or print). */
#include <stdarg.h>
#include <stdio.h>

#include "smla.h"

int smla_fail(smla_status *st, int code, const char *fmt, ...)
{
    va_list ap;
    st->code = code;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    return code;
}
