/* The universal checkpoint view (formats/deepspeed/deepspeed.h). */
#include "formats/deepspeed/deepspeed.h"
#include "formats/deepspeed/deepspeed_int.h"

#include <errno.h>

int rs_universal_build_view(const rs_checkpoint *ck, const rs_layout *l,
			    rs_vtree *t, rs_diag *d)
{
	(void)l;
	(void)t;
	rs_diag_add(d, "%s: not yet", ck->dir_path);
	return -EINVAL;
}

const rs_format_def rs_universal_format = {
	.name = "universal",
	.build_view = rs_universal_build_view,
};
