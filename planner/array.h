/* array: growth of the plain dynamic arrays used across reshardfs.
 *
 * Arrays are a pointer plus a count and a capacity owned by the caller;
 * rs_array_reserve makes room for `need` elements, doubling the capacity so
 * appends are amortised O(1), with the multiplication overflow-checked.
 */
#ifndef RS_ARRAY_H
#define RS_ARRAY_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* Ensures *items holds at least `need` elements of `size` bytes.
 * Returns 0, or -ENOMEM / -E2BIG (the array is then unchanged). */
static inline int rs_array_reserve(void *items, size_t *cap, size_t need,
				   size_t size)
{
	void **p = items;
	size_t n = *cap ? *cap : 8;
	void *grown;

	if (need <= *cap)
		return 0;
	while (n < need) {
		if (n > SIZE_MAX / 2)
			return -E2BIG;
		n *= 2;
	}
	if (n > SIZE_MAX / size)
		return -E2BIG;
	grown = realloc(*p, n * size);
	if (!grown)
		return -ENOMEM;
	*p = grown;
	*cap = n;
	return 0;
}

#endif
