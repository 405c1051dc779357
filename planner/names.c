#include "planner/names.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *name_of(const rs_names *s, size_t item)
{
	const char *p;

	memcpy(&p, s->base + item * s->stride + s->offset, sizeof(p));
	return p;
}

/* By name, then by position: equal names keep their stored order. */
static int cmp_order(const void *a, const void *b, void *arg)
{
	const rs_names *s = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	int c = strcmp(name_of(s, x), name_of(s, y));

	return c ? c : (x > y) - (x < y);
}

int rs_names_sort(rs_names *s, const void *base, size_t n, size_t stride,
		  size_t offset)
{
	s->base = base;
	s->n = n;
	s->stride = stride;
	s->offset = offset;
	s->order = malloc((n ? n : 1) * sizeof(*s->order));
	if (!s->order)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		s->order[i] = i;
	if (n > 1)
		qsort_r(s->order, n, sizeof(*s->order), cmp_order, s);
	return 0;
}

size_t rs_names_item(const rs_names *s, size_t i)
{
	return s->order[i];
}

const char *rs_names_at(const rs_names *s, size_t i)
{
	return name_of(s, s->order[i]);
}

size_t rs_names_next_dup(const rs_names *s, size_t from)
{
	for (size_t p = from ? from : 1; p < s->n; p++)
		if (strcmp(rs_names_at(s, p - 1), rs_names_at(s, p)) == 0)
			return p;
	return s->n;
}

size_t rs_names_find(const rs_names *s, const char *name)
{
	size_t lo = 0, hi = s->n;

	/* The first position whose name is not below `name`. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(rs_names_at(s, mid), name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->n && strcmp(rs_names_at(s, lo), name) == 0)
		return s->order[lo];
	return SIZE_MAX;
}

void rs_names_free(rs_names *s)
{
	free(s->order);
	s->order = NULL;
	s->n = 0;
}

int rs_names_first_dup(const void *base, size_t n, size_t stride,
		       size_t offset, size_t *dup)
{
	rs_names s;
	size_t p;
	int err = rs_names_sort(&s, base, n, stride, offset);

	if (err)
		return err;
	p = rs_names_next_dup(&s, 1);
	*dup = p < n ? rs_names_item(&s, p) : SIZE_MAX;
	rs_names_free(&s);
	return 0;
}

int rs_names_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}
