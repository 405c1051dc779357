#include "planner/diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Enough for every problem a person will read; more would only bury them. */
#define RS_DIAG_MAX_LINES 200

struct rs_diag {
	char *lines[RS_DIAG_MAX_LINES];
	size_t stored;
	size_t count;
};

rs_diag *rs_diag_new(void)
{
	return calloc(1, sizeof(rs_diag));
}

void rs_diag_free(rs_diag *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->stored; i++)
		free(d->lines[i]);
	free(d);
}

void rs_diag_add(rs_diag *d, const char *fmt, ...)
{
	va_list ap;
	char *line = NULL;

	if (!d)
		return;
	d->count++;
	if (d->stored == RS_DIAG_MAX_LINES)
		return;
	va_start(ap, fmt);
	if (vasprintf(&line, fmt, ap) < 0)
		line = NULL;
	va_end(ap);
	if (line)
		d->lines[d->stored++] = line;
}

size_t rs_diag_count(const rs_diag *d)
{
	return d ? d->count : 0;
}

const char *rs_diag_line(const rs_diag *d, size_t i)
{
	return (d && i < d->stored) ? d->lines[i] : NULL;
}
