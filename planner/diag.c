#include "planner/diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if it is not one. */
static int utf8_len(const unsigned char *s)
{
	int n = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3
		: s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : 0;

	if (s[0] >= 0xF5)
		return 0;
	for (int i = 1; i < n; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	return n;
}

/* Lines quote names and strings from hostile files: control bytes and
 * invalid UTF-8 are written as \xNN so a message can neither drive a
 * terminal nor break a consumer that decodes it. */
static char *sanitize(const char *line)
{
	size_t n = strlen(line);
	char *out = malloc(4 * n + 1), *o = out;

	if (!out)
		return NULL;
	for (const unsigned char *s = (const unsigned char *)line; *s;) {
		int k = *s >= 0x80 ? utf8_len(s) : (*s >= 0x20 && *s != 0x7f);

		if (k > 0) {
			memcpy(o, s, (size_t)k);
			o += k;
			s += k;
		} else {
			o += sprintf(o, "\\x%02x", *s++);
		}
	}
	*o = 0;
	return out;
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
	if (line) {
		char *clean = sanitize(line);

		free(line);
		line = clean;
	}
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
