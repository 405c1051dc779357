/* families: the built-in family files (share/reshardfs/families/), loaded
 * once, for the bridge's unit test and fuzz target; aborts if they do not
 * load. */
#ifndef RS_TEST_FAMILIES_H
#define RS_TEST_FAMILIES_H

#include <stdlib.h>

#include "formats/bridge/family.h"

static inline const rs_family *family_find(const char *name, const char *from,
					   const char *to)
{
	static rs_families *fs;

	if (!fs) {
		rs_diag *d = rs_diag_new();

		if (!d || rs_families_load(NULL, &fs, d))
			abort();
		rs_diag_free(d);
	}
	return rs_families_find(fs, name, from, to);
}

#endif
