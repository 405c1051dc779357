#include "formats/codec/json_text.h"

#include "planner/array.h"
#include "planner/names.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A "\u0000" escape anywhere (a backslash outside a string is not JSON, so
 * the whole text can be scanned). */
static bool has_escaped_nul(const char *s, size_t len)
{
	for (size_t i = 0; i + 1 < len; i++) {
		if (s[i] != '\\')
			continue;
		if (s[i + 1] == 'u' && i + 5 < len && s[i + 2] == '0' &&
		    s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
			return true;
		i++; /* the escaped character */
	}
	return false;
}

int rs_json_parse_object(const char *text, size_t len, cJSON **out,
			 char *why, size_t why_size)
{
	const char *end = NULL, *dup;
	cJSON *root;
	int err = -EINVAL;

	*out = NULL;
	if (memchr(text, 0, len) || has_escaped_nul(text, len)) {
		/* cJSON's strings are C strings: the rest would be dropped. */
		snprintf(why, why_size, "NUL character in the JSON text");
		return -EINVAL;
	}
	root = cJSON_ParseWithLengthOpts(text, len, &end, false);
	if (!root || !cJSON_IsObject(root)) {
		snprintf(why, why_size, "not a JSON object (malformed, or nested over %d deep)",
			 CJSON_NESTING_LIMIT);
		goto out;
	}
	while (end && end < text + len &&
	       (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
		end++;
	if (end != text + len) {
		snprintf(why, why_size, "bytes after the JSON object (at %zu)",
			 (size_t)(end ? end - text : 0));
		goto out;
	}
	/* Top-level keys only: nested objects of the files read this way
	 * (.zarray's compressor, metadata.json) are refused or ignored. */
	err = rs_json_duplicate_key(root, &dup);
	if (err)
		goto out;
	err = -EINVAL;
	if (dup) {
		snprintf(why, why_size, "duplicate key \"%.64s\"", dup);
		goto out;
	}
	*out = root;
	root = NULL;
	err = 0;
out:
	cJSON_Delete(root);
	return err;
}

/* Whitespace as cJSON reads it - every byte up to 0x20, not only JSON's
 * four - so a span found here is the value cJSON parsed, and the rewrite
 * replaces that value, not the \v or \f in front of it. */
static bool is_ws(char c)
{
	return (unsigned char)c <= 0x20;
}

static size_t skip_ws(const char *s, size_t i, size_t len)
{
	while (i < len && is_ws(s[i]))
		i++;
	return i;
}

/* Index just past the string starting at s[i] == '"', or len on error. */
static size_t skip_string(const char *s, size_t i, size_t len)
{
	for (i++; i < len; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return len;
}

/* Index just past the value starting at s[i]. */
static size_t skip_value(const char *s, size_t i, size_t len)
{
	int depth = 0;

	if (i < len && s[i] == '"')
		return skip_string(s, i, len);
	for (; i < len; i++) {
		char c = s[i];

		if (c == '"') {
			i = skip_string(s, i, len) - 1;
		} else if (c == '[' || c == '{') {
			depth++;
		} else if (c == ']' || c == '}') {
			if (depth == 0)
				return i;
			if (--depth == 0)
				return i + 1;
		} else if (depth == 0 && (c == ',' || is_ws(c))) {
			return i;
		}
	}
	return len;
}

int rs_json_value_span(const char *s, size_t len, const char *key,
		       size_t *start, size_t *end)
{
	size_t klen = strlen(key);
	size_t i = skip_ws(s, 0, len);

	if (i >= len || s[i] != '{')
		return -EINVAL;
	i++;
	for (;;) {
		size_t kstart, kend, vstart;

		i = skip_ws(s, i, len);
		if (i >= len || s[i] != '"')
			return -ENOENT;
		kstart = i + 1;
		kend = skip_string(s, i, len);
		if (kend >= len)
			return -EINVAL;
		i = skip_ws(s, kend, len);
		if (i >= len || s[i] != ':')
			return -EINVAL;
		vstart = skip_ws(s, i + 1, len);
		i = skip_value(s, vstart, len);
		if (i > len || i == vstart)
			return -EINVAL;
		if (kend - 1 - kstart == klen &&
		    memcmp(s + kstart, key, klen) == 0) {
			*start = vstart;
			*end = i;
			return 0;
		}
		i = skip_ws(s, i, len);
		if (i >= len || s[i] != ',')
			return -ENOENT;
		i++;
	}
}

/* Appends to a growing buffer; returns false on allocation failure. */
typedef struct {
	char *buf;
	size_t len, cap;
} strbuf;

static bool put(strbuf *b, const char *s, size_t n)
{
	if (rs_array_reserve(&b->buf, &b->cap, b->len + n + 1, 1))
		return false;
	memcpy(b->buf + b->len, s, n);
	b->len += n;
	b->buf[b->len] = 0;
	return true;
}

char *rs_json_format_like(const char *old, size_t old_len, const uint64_t *v,
			  int n)
{
	const char *nl = memchr(old, '\n', old_len);
	const char *item_sep = ", ", *open_ws = "", *close_ws = "";
	size_t item_sep_len = 2, open_len = 0, close_len = 0;
	strbuf b = { 0 };
	bool ok = true;

	if (nl) {
		/* "[\n<indent>1,\n<indent>2\n<outdent>]" */
		const char *first = old + 1, *last = old + old_len - 1;
		const char *p = first;

		while (p < last && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
			p++;
		open_ws = first;
		open_len = (size_t)(p - first);
		p = last;
		while (p > first && (p[-1] == ' ' || p[-1] == '\t'))
			p--;
		if (p > first && p[-1] == '\n')
			p--;
		close_ws = p;
		close_len = (size_t)(last - p);
		item_sep = NULL;
	} else if (old_len > 2 && !memchr(old, ' ', old_len)) {
		item_sep = ",";
		item_sep_len = 1;
	}
	ok = put(&b, "[", 1);
	if (n > 0 && nl)
		ok = ok && put(&b, open_ws, open_len);
	for (int i = 0; i < n && ok; i++) {
		char num[24];
		int k = snprintf(num, sizeof(num), "%llu", (unsigned long long)v[i]);

		if (i > 0) {
			if (item_sep)
				ok = put(&b, item_sep, item_sep_len);
			else
				ok = put(&b, ",", 1) && put(&b, open_ws, open_len);
		}
		ok = ok && put(&b, num, (size_t)k);
	}
	if (n > 0 && nl)
		ok = ok && put(&b, close_ws, close_len);
	ok = ok && put(&b, "]", 1);
	if (!ok) {
		free(b.buf);
		return NULL;
	}
	return b.buf;
}

int rs_json_replace_values(const char *text, size_t len, const char **keys,
			   const char *const *values, int n, char **out,
			   size_t *out_len)
{
	size_t start[8], end[8];
	int order[8];
	strbuf b = { 0 };
	size_t at = 0;
	int err;

	if (n > 8)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		err = rs_json_value_span(text, len, keys[i], &start[i], &end[i]);
		if (err)
			return err;
		order[i] = i;
	}
	/* Splice in text order. */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && start[order[j]] < start[order[j - 1]]; j--) {
			int tmp = order[j];

			order[j] = order[j - 1];
			order[j - 1] = tmp;
		}
	for (int k = 0; k < n; k++) {
		int i = order[k];

		if (!put(&b, text + at, start[i] - at) ||
		    !put(&b, values[i], strlen(values[i]))) {
			free(b.buf);
			return -ENOMEM;
		}
		at = end[i];
	}
	if (!put(&b, text + at, len - at)) {
		free(b.buf);
		return -ENOMEM;
	}
	*out = b.buf;
	*out_len = b.len;
	return 0;
}

int rs_json_replace_lists(const char *text, size_t len, const char **keys,
			  const uint64_t *const *values, const int *counts,
			  int n, char **out, size_t *out_len)
{
	char *lists[8] = { 0 };
	int err = 0;

	if (n > 8)
		return -EINVAL;
	for (int i = 0; i < n && !err; i++) {
		size_t start, end;

		err = rs_json_value_span(text, len, keys[i], &start, &end);
		if (!err && !(lists[i] = rs_json_format_like(text + start,
							     end - start,
							     values[i],
							     counts[i])))
			err = -ENOMEM;
	}
	if (!err)
		err = rs_json_replace_values(text, len, keys,
					     (const char *const *)lists, n,
					     out, out_len);
	for (int i = 0; i < n; i++)
		free(lists[i]);
	return err;
}

bool rs_json_u64(const cJSON *v, uint64_t *out)
{
	double x;

	if (!cJSON_IsNumber(v))
		return false;
	x = v->valuedouble;
	if (!(x >= 0 && x <= 9007199254740992.0) || x != (double)(uint64_t)x)
		return false;
	*out = (uint64_t)x;
	return true;
}

int rs_json_duplicate_key(const cJSON *obj, const char **dup)
{
	const cJSON *it;
	const char **keys;
	size_t n = 0, at;
	int err;

	*dup = NULL;
	cJSON_ArrayForEach(it, obj)
		n++;
	if (n < 2)
		return 0;
	if (n <= 8) {
		/* A safetensors tensor entry: three keys, no allocation. */
		for (const cJSON *a = obj->child; a && !*dup; a = a->next)
			for (const cJSON *b = a->next; b && !*dup; b = b->next)
				if (strcmp(a->string, b->string) == 0)
					*dup = a->string;
		return 0;
	}
	keys = malloc(n * sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	n = 0;
	cJSON_ArrayForEach(it, obj)
		keys[n++] = it->string ? it->string : "";
	err = rs_names_first_dup(keys, n, sizeof(*keys), 0, &at);
	if (!err && at != SIZE_MAX)
		*dup = keys[at];
	free(keys);
	return err;
}

size_t rs_json_first_fraction(const char *text, size_t len)
{
	bool in_string = false;

	for (size_t i = 0; i < len; i++) {
		char c = text[i];

		if (in_string) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_string = false;
			continue;
		}
		if (c == '"') {
			in_string = true;
			continue;
		}
		if (c == '-' || (c >= '0' && c <= '9')) {
			size_t j = i;
			bool fraction = false;

			for (; j < len && text[j] && strchr("+-.0123456789eE", text[j]);
			     j++)
				fraction |= text[j] == '.' || text[j] == 'e' ||
					    text[j] == 'E';
			if (fraction)
				return i;
			i = j - 1;
		}
	}
	return SIZE_MAX;
}
