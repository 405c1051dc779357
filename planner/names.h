/* names: items sorted by their names, and the first name given twice.
 *
 * Readers refuse a checkpoint that names one tensor twice (Python keeps
 * the last of two equal keys, a catalog would hold both), and look names
 * up in what they read.  rs_names sorts an index of any array whose items
 * hold a `const char *` name at a fixed offset, so one helper serves
 * arrays of strings, of catalog tensors and of a reader's own records.
 * Equal names keep their items' order, so the first of two is the one
 * stored first.
 *
 * Ownership: an rs_names owns only its order; the items and their names
 * must outlive it.  rs_names_free is safe on a zeroed one.
 */
#ifndef RS_NAMES_H
#define RS_NAMES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	const char *base;       /* the items */
	size_t n, stride, offset;
	size_t *order;          /* item indices by name */
} rs_names;

/* Sorts the n items at `base` (each `stride` bytes, the name pointer at
 * `offset` in each).  0 or -ENOMEM. */
int rs_names_sort(rs_names *s, const void *base, size_t n, size_t stride,
		  size_t offset);

/* The i-th item in name order: its index, and its name. */
size_t rs_names_item(const rs_names *s, size_t i);
const char *rs_names_at(const rs_names *s, size_t i);

/* The first position p >= from (and >= 1) whose name equals the one
 * before it, or s->n: rs_names_item(s, p) is the later of the two. */
size_t rs_names_next_dup(const rs_names *s, size_t from);

/* The index of the item named `name` (the first stored, if several), or
 * SIZE_MAX. */
size_t rs_names_find(const rs_names *s, const char *name);

void rs_names_free(rs_names *s);

/* Sorts, and reports the first name given twice: 0 when every name is
 * unique (*dup = SIZE_MAX), else *dup = the later item's index; -ENOMEM.
 * The order is freed. */
int rs_names_first_dup(const void *base, size_t n, size_t stride,
		       size_t offset, size_t *dup);

/* qsort's comparator for an array of `char *` (strcmp would compare the
 * pointers' bytes). */
int rs_names_cmp(const void *a, const void *b);

#endif
